//! The W3C trace context of a request (Trace Context level 1): the span the dataplane made
//! for it, and the parsing of a client's `traceparent`. The opentelemetry plugin sets it in
//! [`crate::plugins::PluginCtx::trace`]; the loggers' `log_format` reads it.

/// The trace context of one request: the span the dataplane made for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// Trace id (the client's, or new).
    pub trace_id: [u8; 16],
    /// This request's span id.
    pub span_id: [u8; 8],
    /// The client's span id, when its `traceparent` was valid.
    pub parent_span_id: Option<[u8; 8]>,
    /// Whether the span is sampled (exported).
    pub sampled: bool,
}

impl TraceContext {
    /// The trace id, 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id, 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// The `traceparent` sent upstream.
    pub fn traceparent(&self) -> String {
        String::from_utf8_lossy(&self.traceparent_bytes()).into_owned()
    }

    /// The `traceparent`, on the stack: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent_bytes(&self) -> [u8; 55] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        for (i, &x) in self.trace_id.iter().enumerate() {
            out[3 + 2 * i] = DIGITS[usize::from(x >> 4)];
            out[4 + 2 * i] = DIGITS[usize::from(x & 15)];
        }
        for (i, &x) in self.span_id.iter().enumerate() {
            out[36 + 2 * i] = DIGITS[usize::from(x >> 4)];
            out[37 + 2 * i] = DIGITS[usize::from(x & 15)];
        }
        if self.sampled {
            out[54] = b'1';
        }
        out
    }
}

fn push_hex(s: &mut String, b: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &x in b {
        s.push(DIGITS[usize::from(x >> 4)] as char);
        s.push(DIGITS[usize::from(x & 15)] as char);
    }
}

pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    push_hex(&mut s, b);
    s
}

/// A client's valid `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// Its trace id.
    pub trace_id: [u8; 16],
    /// Its span id (the parent of the dataplane's span).
    pub span_id: [u8; 8],
    /// Its sampled flag.
    pub sampled: bool,
}

pub fn unhex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        // NB: W3C: lower-case only; upper-case hex makes the header invalid.
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(s[2 * i])? << 4) | digit(s[2 * i + 1])?;
    }
    Some(out)
}

/// Parses one `traceparent` value (W3C Trace Context level 1); `None` when malformed.
pub fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 bytes.
    if v.len() < 55 {
        return None;
    }
    let version: [u8; 1] = unhex(&v[0..2])?;
    if version[0] == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    // Version 00 is exactly 55 bytes; a later version may append "-" and more fields.
    if v.len() > 55 && (version[0] == 0 || v[55] != b'-') {
        return None;
    }
    let trace_id: [u8; 16] = unhex(&v[3..35])?;
    let span_id: [u8; 8] = unhex(&v[36..52])?;
    let flags: [u8; 1] = unhex(&v[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags[0] & 1 == 1,
    })
}
