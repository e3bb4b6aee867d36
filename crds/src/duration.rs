//! Go-style duration strings as used by APISIX (`metav1.Duration`): `500ms`, `30s`, `1m30s`.

use std::time::Duration;

/// Regular expression (RE2 / ECMA compatible) that matches exactly the strings
/// [`parse_duration`] accepts, short of overflow. Used as the CRD `pattern` of duration fields.
pub const DURATION_PATTERN: &str = r"^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// Why a duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration; expected a value like \"30s\", \"500ms\" or \"1m30s\"")]
    Empty,
    /// A number was expected at byte `at` (e.g. a sign, a stray unit, or garbage).
    #[error("invalid duration {input:?}: expected a number at byte {at}")]
    ExpectedNumber {
        /// The whole input.
        input: String,
        /// Byte offset of the problem.
        at: usize,
    },
    /// A number had no unit after it (only the bare `0` may omit the unit).
    #[error("invalid duration {input:?}: missing unit after a number (use ns, us, ms, s, m or h)")]
    MissingUnit {
        /// The whole input.
        input: String,
    },
    /// A unit other than `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`.
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit as written.
        unit: String,
    },
    /// The value does not fit in 2^63-1 nanoseconds (about 292 years), Go's limit.
    #[error("invalid duration {input:?}: too large")]
    Overflow {
        /// The whole input.
        input: String,
    },
}

/// Go's `time.Duration` limit, which APISIX inherits.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a Go/APISIX duration string such as `30s`, `500ms`, `1m30s`, `1.5h` or `0`.
///
/// Accepted units: `ns`, `us` (also `µs`/`μs`), `ms`, `s`, `m`, `h`; numbers may have a decimal
/// fraction; several number+unit pairs are added up. Unlike Go, a sign is rejected: a negative
/// timeout or interval has no meaning in any APISIX field.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    if input.is_empty() {
        return Err(DurationError::Empty);
    }
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    let bytes = input.as_bytes();
    let mut pos = 0;
    let mut total: u128 = 0;
    while pos < bytes.len() {
        // Number: digits, optionally `.` and more digits; at least one digit overall.
        let int_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let int_digits = &input[int_start..pos];
        let mut frac_digits = "";
        if pos < bytes.len() && bytes[pos] == b'.' {
            pos += 1;
            let frac_start = pos;
            while pos < bytes.len() && bytes[pos].is_ascii_digit() {
                pos += 1;
            }
            frac_digits = &input[frac_start..pos];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(DurationError::ExpectedNumber {
                input: input.to_owned(),
                at: int_start,
            });
        }
        // Unit: everything up to the next digit or `.`.
        let unit_start = pos;
        while pos < bytes.len() && !bytes[pos].is_ascii_digit() && bytes[pos] != b'.' {
            pos += 1;
        }
        let unit = &input[unit_start..pos];
        let unit_nanos: u128 = match unit {
            "" => {
                return Err(DurationError::MissingUnit {
                    input: input.to_owned(),
                });
            }
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            other => {
                return Err(DurationError::UnknownUnit {
                    input: input.to_owned(),
                    unit: other.to_owned(),
                });
            }
        };
        let overflow = || DurationError::Overflow {
            input: input.to_owned(),
        };
        let whole: u128 = if int_digits.is_empty() {
            0
        } else {
            // More than 39 digits cannot fit in u128; anything that large overflows anyway.
            int_digits.parse::<u128>().map_err(|_| overflow())?
        };
        let mut nanos = whole.checked_mul(unit_nanos).ok_or_else(overflow)?;
        // NB: digits beyond the 18th cannot change the result by a nanosecond for any unit up to
        // hours, so they are ignored rather than risking overflow of the scale.
        let frac = &frac_digits[..frac_digits.len().min(18)];
        if !frac.is_empty() {
            let numerator: u128 = frac.parse::<u128>().map_err(|_| overflow())?;
            let scale = 10u128.pow(frac.len() as u32);
            nanos += numerator * unit_nanos / scale;
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        if total > MAX_NANOS {
            return Err(overflow());
        }
    }
    // `total <= i64::MAX`, so the conversion cannot fail.
    let nanos = u64::try_from(total).map_err(|_| DurationError::Overflow {
        input: input.to_owned(),
    })?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_duration(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn parses_single_units() {
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("2h"), Duration::from_secs(7200));
        assert_eq!(ok("15us"), Duration::from_micros(15));
        assert_eq!(ok("15µs"), Duration::from_micros(15));
        assert_eq!(ok("15μs"), Duration::from_micros(15));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn parses_combinations_and_fractions() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1h2m3s4ms"), Duration::from_millis(3_723_004));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5m"), Duration::from_secs(30));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        assert_eq!(ok("1.0000000000000000000009s"), Duration::from_secs(1));
        // Go accepts repeated and unordered units; so do we.
        assert_eq!(ok("1s1s"), Duration::from_secs(2));
        assert_eq!(ok("30s1m"), Duration::from_secs(90));
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        let e = parse_duration("30").unwrap_err();
        assert!(matches!(e, DurationError::MissingUnit { .. }), "{e:?}");
        assert!(e.to_string().contains("\"30\""), "{e}");
        let e = parse_duration("5d").unwrap_err();
        assert_eq!(
            e,
            DurationError::UnknownUnit {
                input: "5d".into(),
                unit: "d".into()
            }
        );
        assert!(e.to_string().contains("unknown unit \"d\""), "{e}");
        assert!(matches!(
            parse_duration("-1s").unwrap_err(),
            DurationError::ExpectedNumber { at: 0, .. }
        ));
        assert!(matches!(
            parse_duration("s").unwrap_err(),
            DurationError::ExpectedNumber { .. }
        ));
        assert!(matches!(
            parse_duration("1s.").unwrap_err(),
            DurationError::ExpectedNumber { at: 2, .. }
        ));
        assert!(matches!(
            parse_duration(" 1s").unwrap_err(),
            DurationError::ExpectedNumber { .. }
        ));
        assert!(matches!(
            parse_duration("1 s").unwrap_err(),
            DurationError::UnknownUnit { .. }
        ));
    }

    #[test]
    fn rejects_overflow() {
        // Go's maximum is 2562047h47m16.854775807s.
        assert!(parse_duration("2562047h").is_ok());
        assert!(matches!(
            parse_duration("2562048h").unwrap_err(),
            DurationError::Overflow { .. }
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999999999999999999999h").unwrap_err(),
            DurationError::Overflow { .. }
        ));
    }
}
