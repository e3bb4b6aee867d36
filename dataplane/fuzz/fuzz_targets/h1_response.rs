//! The upstream response-head parser against httparse on the same bytes: it may refuse more
//! (strict framing), never less, and what it accepts must be what httparse read.
#![no_main]

use bytes::BytesMut;
use http::Method;
use sluice_io::h1::{Framing, MAX_HEAD_BYTES, MAX_HEADERS, parse_response_head};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (method, wire) = match data.split_first() {
        Some((b, rest)) if b % 4 == 0 => (Method::HEAD, rest),
        Some((_, rest)) => (Method::GET, rest),
        None => return,
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut reference = httparse::Response::new(&mut headers);
    let theirs = reference.parse(wire);
    let mut buf = BytesMut::from(wire);
    let ours = parse_response_head(&mut buf, &method);
    match (&theirs, &ours) {
        (Err(_), Ok(Some(_))) => panic!("accepted a head httparse refuses"),
        (Ok(httparse::Status::Partial), Ok(Some(_))) => panic!("accepted an incomplete head"),
        (Ok(httparse::Status::Complete(len)), Ok(Some(head))) => {
            assert!(*len <= MAX_HEAD_BYTES, "a head over the limit was accepted");
            assert_eq!(head.head_len, *len, "another head length than httparse's");
            assert_eq!(
                Some(head.parts.status.as_u16()),
                reference.code,
                "another status"
            );
            assert_eq!(
                buf.len(),
                wire.len() - len,
                "the body's bytes were not left in place"
            );
            if let Framing::Length(n) = head.framing {
                // The length came from a content-length of digits only.
                let lengths: Vec<&[u8]> = reference
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| h.value)
                    .collect();
                assert!(!lengths.is_empty(), "a length without content-length");
                for v in lengths {
                    let s = std::str::from_utf8(v)
                        .expect("ascii")
                        .trim_matches([' ', '\t']);
                    assert_eq!(s.parse::<u64>().ok(), Some(n), "length {n} from {s:?}");
                    assert!(
                        s.bytes().all(|b| b.is_ascii_digit()),
                        "a signed or spaced length"
                    );
                }
            }
        }
        _ => {}
    }
});
