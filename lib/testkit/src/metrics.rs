//! Reading samples out of a Prometheus text exposition (`/metrics`, or a registry rendered
//! in process): one parser, two ways to name a series.

/// `(series, value)` of every sample line of `text`: the series is the metric name with its
/// labels exactly as rendered (`name{a="1",b="2"}`), the value the last field. Comments
/// and lines whose value does not parse are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series, value.parse().ok()?))
        })
}

/// The value of the sample whose series is exactly `series` (name with labels as rendered,
/// e.g. `sluice_controller_leader` or `apisix_http_status{code="200",route="r"}`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    samples(text).find(|(s, _)| *s == series).map(|(_, v)| v)
}

/// The value of the first sample of metric `name` that carries every label of `labels`
/// (`key="value"` strings, in any order), e.g.
/// `metric(&text, "sluice_upstream_endpoint_healthy", &["upstream=\"u\""])`.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    samples(text)
        .find(|(s, _)| {
            let (n, rest) = s.split_once('{').unwrap_or((*s, ""));
            n == name && labels.iter().all(|want| rest.contains(want))
        })
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP up Up.\n# TYPE up gauge\nup 1\nreq_total{route=\"a\",code=\"200\"} 3\nreq_total{route=\"b\",code=\"200\"} 4\nreq_total_sum 9.5\n";

    #[test]
    fn a_series_is_found_by_exact_name_or_by_labels() {
        assert_eq!(sample(TEXT, "up"), Some(1.0));
        assert_eq!(
            sample(TEXT, "req_total{route=\"b\",code=\"200\"}"),
            Some(4.0)
        );
        assert_eq!(sample(TEXT, "req_total"), None);
        assert_eq!(metric(TEXT, "req_total", &["code=\"200\""]), Some(3.0));
        assert_eq!(metric(TEXT, "req_total", &["route=\"b\""]), Some(4.0));
        assert_eq!(metric(TEXT, "req_total_sum", &[]), Some(9.5));
        assert_eq!(metric(TEXT, "req", &[]), None);
    }
}
