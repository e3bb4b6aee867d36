//! Parsing of human durations such as `10s`, `500ms`, `1m30s`.

use std::time::Duration;

use crate::error::BenchError;

/// Parses a duration written as one or more `<number><unit>` groups, where the
/// unit is `ms`, `s`, `m` or `h` (`1m30s`, `10s`, `250ms`). A bare number means
/// seconds. Fractions are allowed (`1.5s`). Zero and negative values are rejected.
pub fn parse_duration(input: &str) -> Result<Duration, BenchError> {
    let err = |reason| BenchError::InvalidDuration {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(err("empty"));
    }
    if let Ok(secs) = text.parse::<f64>() {
        return positive(secs).ok_or_else(|| err("must be a positive number of seconds"));
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(err("expected a number before each unit"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| err("malformed number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(err("missing unit after number (use ms, s, m or h)")),
            _ => return Err(err("unknown unit (use ms, s, m or h)")),
        };
        rest = &rest[unit_len..];
        total += value * factor;
    }
    positive(total).ok_or_else(|| err("must be positive"))
}

fn positive(secs: f64) -> Option<Duration> {
    if secs.is_finite() && secs > 0.0 {
        Some(Duration::from_secs_f64(secs))
    } else {
        None
    }
}

/// Renders a duration for wrk's `-d` flag, which only understands whole
/// seconds (and minutes/hours). Sub-second parts are rounded up, with a
/// minimum of one second.
pub fn wrk_duration_arg(d: Duration) -> String {
    let mut secs = d.as_secs();
    if d.subsec_nanos() > 0 {
        secs += 1;
    }
    format!("{}s", secs.max(1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration(" 1.5s ").unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "s", "10x", "0s", "0", "-3", "1.2.3s", "ms10", "5sec"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn error_names_input() {
        let e = parse_duration("10x").unwrap_err().to_string();
        assert!(e.contains("10x"), "{e}");
        assert!(e.contains("unknown unit"), "{e}");
    }

    #[test]
    fn wrk_arg_rounds_up_to_whole_seconds() {
        assert_eq!(wrk_duration_arg(Duration::from_secs(10)), "10s");
        assert_eq!(wrk_duration_arg(Duration::from_millis(1500)), "2s");
        assert_eq!(wrk_duration_arg(Duration::from_millis(100)), "1s");
    }
}
