//! Parsing of `wrk --latency` output.

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// Socket-level errors as counted by wrk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketErrors {
    /// Failed connects.
    pub connect: u64,
    /// Failed reads (including connections closed by the proxy mid-response).
    pub read: u64,
    /// Failed writes.
    pub write: u64,
    /// Requests that did not complete within wrk's timeout (2 s by default).
    pub timeout: u64,
}

impl SocketErrors {
    /// Sum of all four counters.
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout
    }
}

/// The figures the harness takes from one wrk run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WrkReport {
    /// Completed requests in the run.
    pub requests: u64,
    /// Length of the run as measured by wrk, in seconds.
    pub duration_s: f64,
    /// wrk's `Requests/sec` line.
    pub requests_per_sec: f64,
    /// Mean latency, milliseconds.
    pub latency_avg_ms: f64,
    /// Maximum latency, milliseconds.
    pub latency_max_ms: f64,
    /// 50th percentile latency, milliseconds.
    pub p50_ms: f64,
    /// 75th percentile latency, milliseconds.
    pub p75_ms: f64,
    /// 90th percentile latency, milliseconds.
    pub p90_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Responses with a status of 400 or above (wrk labels them "Non-2xx or 3xx").
    pub non_2xx_3xx: u64,
    /// Socket errors; all zero when wrk printed no `Socket errors` line.
    pub socket_errors: SocketErrors,
}

impl WrkReport {
    /// True when the run had any bad response or socket error, which makes
    /// its throughput figures untrustworthy.
    pub fn has_errors(&self) -> bool {
        self.non_2xx_3xx > 0 || self.socket_errors.total() > 0
    }
}

/// Converts one of wrk's time figures (`838.07us`, `1.20ms`, `2.00s`, `1.00m`,
/// `1.00h`) to milliseconds.
pub fn parse_time_ms(text: &str) -> Result<f64, BenchError> {
    let text = text.trim();
    let (number, factor) = if let Some(n) = text.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        return Err(BenchError::WrkOutput(format!(
            "time without unit: {text:?}"
        )));
    };
    let value: f64 = number
        .parse()
        .map_err(|_| BenchError::WrkOutput(format!("bad time value: {text:?}")))?;
    Ok(value * factor)
}

/// Parses wrk's count suffixes (`765548`, `76.94k`, `1.2M`) into a number.
fn parse_count(text: &str) -> Result<f64, BenchError> {
    let text = text.trim();
    let (number, factor) = match text.chars().last() {
        Some('k') => (&text[..text.len() - 1], 1e3),
        Some('M') => (&text[..text.len() - 1], 1e6),
        Some('G') => (&text[..text.len() - 1], 1e9),
        _ => (text, 1.0),
    };
    number
        .parse::<f64>()
        .map(|v| v * factor)
        .map_err(|_| BenchError::WrkOutput(format!("bad count: {text:?}")))
}

fn parse_u64(text: &str, what: &str) -> Result<u64, BenchError> {
    text.trim()
        .trim_end_matches(',')
        .parse()
        .map_err(|_| BenchError::WrkOutput(format!("bad {what}: {text:?}")))
}

/// Parses the full stdout of `wrk --latency`.
pub fn parse_wrk_output(output: &str) -> Result<WrkReport, BenchError> {
    let mut requests = None;
    let mut duration_s = None;
    let mut requests_per_sec = None;
    let mut latency_avg_ms = None;
    let mut latency_max_ms = None;
    let mut percentiles: [Option<f64>; 4] = [None; 4];
    let mut non_2xx_3xx = 0;
    let mut socket_errors = SocketErrors::default();

    for line in output.lines() {
        let line = line.trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Latency", avg, _stdev, max, ..] => {
                latency_avg_ms = Some(parse_time_ms(avg)?);
                latency_max_ms = Some(parse_time_ms(max)?);
            }
            [pct, value] if pct.ends_with('%') => {
                let slot = match *pct {
                    "50%" => Some(0),
                    "75%" => Some(1),
                    "90%" => Some(2),
                    "99%" => Some(3),
                    _ => None,
                };
                if let Some(i) = slot {
                    percentiles[i] = Some(parse_time_ms(value)?);
                }
            }
            [count, "requests", "in", took, ..] => {
                requests = Some(parse_u64(count, "request count")?);
                duration_s = Some(parse_time_ms(took.trim_end_matches(','))? / 1_000.0);
            }
            ["Requests/sec:", value] => {
                requests_per_sec = Some(parse_count(value)?);
            }
            ["Non-2xx", "or", "3xx", "responses:", value] => {
                non_2xx_3xx = parse_u64(value, "non-2xx count")?;
            }
            ["Socket", "errors:", rest @ ..] => {
                // "connect 0, read 0, write 0, timeout 0"
                for pair in rest.chunks(2) {
                    if let [name, value] = pair {
                        let v = parse_u64(value, "socket error count")?;
                        match *name {
                            "connect" => socket_errors.connect = v,
                            "read" => socket_errors.read = v,
                            "write" => socket_errors.write = v,
                            "timeout" => socket_errors.timeout = v,
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }

    let missing = |what: &str| BenchError::WrkOutput(format!("no {what} in wrk output"));
    let [p50, p75, p90, p99] = percentiles;
    Ok(WrkReport {
        requests: requests.ok_or_else(|| missing("'N requests in T' line"))?,
        duration_s: duration_s.ok_or_else(|| missing("run duration"))?,
        requests_per_sec: requests_per_sec.ok_or_else(|| missing("Requests/sec line"))?,
        latency_avg_ms: latency_avg_ms.ok_or_else(|| missing("Latency line"))?,
        latency_max_ms: latency_max_ms.ok_or_else(|| missing("Latency line"))?,
        p50_ms: p50.ok_or_else(|| missing("50% latency (was --latency given?)"))?,
        p75_ms: p75.ok_or_else(|| missing("75% latency (was --latency given?)"))?,
        p90_ms: p90.ok_or_else(|| missing("90% latency (was --latency given?)"))?,
        p99_ms: p99.ok_or_else(|| missing("99% latency (was --latency given?)"))?,
        non_2xx_3xx,
        socket_errors,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const CLEAN: &str = "Running 10s test @ http://127.0.0.1:9080/hello
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   838.07us  200.89us  12.04ms   93.45%
    Req/Sec    76.94k     3.07k   80.41k    83.00%
  Latency Distribution
     50%  798.00us
     75%    0.90ms
     90%    1.00ms
     99%    1.50ms
  765548 requests in 10.00s, 110.97MB read
Requests/sec:  76543.21
Transfer/sec:     11.10MB
";

    const ERRORS: &str = "Running 1m test @ http://127.0.0.1:9080/hello
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20s   300.00ms    2.00s    70.00%
    Req/Sec     1.00k   100.00     1.20k    50.00%
  Latency Distribution
     50%    1.10s
     75%    1.30s
     90%    1.50s
     99%    1.90s
  60000 requests in 1.00m, 8.00MB read
  Socket errors: connect 3, read 17, write 0, timeout 250
  Non-2xx or 3xx responses: 42
Requests/sec:   1000.00
Transfer/sec:    136.53KB
";

    #[test]
    fn parses_a_clean_run() {
        let r = parse_wrk_output(CLEAN).unwrap();
        assert_eq!(r.requests, 765_548);
        assert!((r.duration_s - 10.0).abs() < 1e-9);
        assert!((r.requests_per_sec - 76_543.21).abs() < 1e-6);
        assert!((r.latency_avg_ms - 0.83807).abs() < 1e-9);
        assert!((r.latency_max_ms - 12.04).abs() < 1e-9);
        assert!((r.p50_ms - 0.798).abs() < 1e-9);
        assert!((r.p75_ms - 0.9).abs() < 1e-9);
        assert!((r.p90_ms - 1.0).abs() < 1e-9);
        assert!((r.p99_ms - 1.5).abs() < 1e-9);
        assert_eq!(r.non_2xx_3xx, 0);
        assert_eq!(r.socket_errors, SocketErrors::default());
        assert!(!r.has_errors());
    }

    #[test]
    fn parses_errors_and_second_units() {
        let r = parse_wrk_output(ERRORS).unwrap();
        assert_eq!(r.requests, 60_000);
        assert!((r.duration_s - 60.0).abs() < 1e-9);
        assert!((r.p50_ms - 1_100.0).abs() < 1e-9);
        assert!((r.p99_ms - 1_900.0).abs() < 1e-9);
        assert!((r.latency_avg_ms - 1_200.0).abs() < 1e-9);
        assert_eq!(r.non_2xx_3xx, 42);
        assert_eq!(
            r.socket_errors,
            SocketErrors {
                connect: 3,
                read: 17,
                write: 0,
                timeout: 250
            }
        );
        assert_eq!(r.socket_errors.total(), 270);
        assert!(r.has_errors());
    }

    #[test]
    fn only_non_2xx_is_flagged() {
        let out = CLEAN.replace(
            "Requests/sec:",
            "  Non-2xx or 3xx responses: 1\nRequests/sec:",
        );
        let r = parse_wrk_output(&out).unwrap();
        assert_eq!(r.non_2xx_3xx, 1);
        assert!(r.has_errors());
    }

    #[test]
    fn time_units() {
        assert!((parse_time_ms("500us").unwrap() - 0.5).abs() < 1e-12);
        assert!((parse_time_ms("2.5ms").unwrap() - 2.5).abs() < 1e-12);
        assert!((parse_time_ms("3s").unwrap() - 3_000.0).abs() < 1e-9);
        assert!((parse_time_ms("1.50m").unwrap() - 90_000.0).abs() < 1e-9);
        assert!((parse_time_ms("1h").unwrap() - 3_600_000.0).abs() < 1e-9);
        assert!(parse_time_ms("12").is_err());
        assert!(parse_time_ms("abcms").is_err());
    }

    #[test]
    fn requests_per_sec_with_suffix() {
        let out = CLEAN.replace("Requests/sec:  76543.21", "Requests/sec:  1.5k");
        let r = parse_wrk_output(&out).unwrap();
        assert!((r.requests_per_sec - 1_500.0).abs() < 1e-9);
    }

    #[test]
    fn missing_latency_distribution_is_an_error() {
        let out: String = CLEAN
            .lines()
            .filter(|l| {
                !l.trim_start().starts_with(|c: char| c.is_ascii_digit()) || l.contains("requests")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse_wrk_output(&out).unwrap_err().to_string();
        assert!(e.contains("--latency"), "{e}");
    }

    #[test]
    fn empty_output_is_an_error() {
        assert!(parse_wrk_output("").is_err());
        assert!(
            parse_wrk_output("unable to connect to 127.0.0.1:9080 Connection refused").is_err()
        );
    }
}
