//! An SVG chart of two result files side by side (`compare A.json B.json --svg out.svg`),
//! the way one compares a Graviton (arm64) machine with an x86_64 one.
//!
//! Two panels: requests per CPU-second of nginx and of Sluice on each machine (the absolute
//! efficiency), and Sluice ÷ nginx on each machine (req/s, req/CPU-s, p99 latency) with the
//! 1.0 line, which is the comparison that survives run-to-run drift. The SVG is written by
//! hand: a few rectangles and labels, no plotting stack in the workspace for it.

use std::fmt::Write as _;

use crate::report::{BenchResult, thousands};

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const PANEL_TOP: f64 = 80.0;
const PANEL_HEIGHT: f64 = 260.0;
/// Fill colours of machine A and machine B.
const COLOURS: [&str; 2] = ["#4e79a7", "#f28e2b"];

/// One bar: its value and the text above it.
struct Bar {
    value: Option<f64>,
    label: String,
}

/// A group of bars (one per machine) under a category label.
struct Group {
    name: &'static str,
    bars: [Bar; 2],
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short name of a result's machine: `aarch64 · Neoverse-V1 · 2 CPUs`.
fn machine_label(r: &BenchResult, file: &str) -> String {
    format!(
        "{} · {} · {} CPUs ({file})",
        r.machine.arch_label(),
        r.machine.cpu_model,
        r.machine.nproc
    )
}

/// Draws one panel of grouped bars into `svg`, with its own y scale from 0 to the largest
/// value (at least `min_top`), and a dashed reference line at `reference` if given.
fn panel(
    svg: &mut String,
    x0: f64,
    width: f64,
    title: &str,
    groups: &[Group],
    min_top: f64,
    reference: Option<f64>,
) {
    let top = groups
        .iter()
        .flat_map(|g| g.bars.iter().filter_map(|b| b.value))
        .filter(|v| v.is_finite())
        .fold(min_top, f64::max)
        * 1.15;
    let y_of = |v: f64| PANEL_TOP + PANEL_HEIGHT - (v / top) * PANEL_HEIGHT;
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold" text-anchor="middle">{}</text>"#,
        x0 + width / 2.0,
        PANEL_TOP - 16.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#333"/>"##,
        y = PANEL_TOP + PANEL_HEIGHT,
        x1 = x0 + width
    );
    if let Some(r) = reference {
        let y = y_of(r);
        let _ = writeln!(
            svg,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{ty:.1}" font-size="10" fill="#666">nginx = {r}</text>"##,
            x1 = x0 + width,
            tx = x0 + 2.0,
            ty = y - 3.0
        );
    }
    let group_w = width / groups.len().max(1) as f64;
    let bar_w = (group_w * 0.6 / 2.0).min(60.0);
    for (i, g) in groups.iter().enumerate() {
        let gx = x0 + group_w * i as f64 + group_w / 2.0;
        for (j, bar) in g.bars.iter().enumerate() {
            let bx = gx - bar_w + bar_w * j as f64;
            match bar.value.filter(|v| v.is_finite()) {
                Some(v) => {
                    let y = y_of(v);
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{bx:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"><title>{t}</title></rect><text x="{tx:.1}" y="{ty:.1}" font-size="10" text-anchor="middle">{t}</text>"#,
                        w = bar_w - 4.0,
                        h = PANEL_TOP + PANEL_HEIGHT - y,
                        c = COLOURS[j],
                        t = escape(&bar.label),
                        tx = bx + (bar_w - 4.0) / 2.0,
                        ty = y - 4.0
                    );
                }
                None => {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{tx:.1}" y="{ty:.1}" font-size="10" fill="#999" text-anchor="middle">n/a</text>"##,
                        tx = bx + (bar_w - 4.0) / 2.0,
                        ty = PANEL_TOP + PANEL_HEIGHT - 4.0
                    );
                }
            }
        }
        let _ = writeln!(
            svg,
            r#"<text x="{gx:.1}" y="{y:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            escape(g.name),
            y = PANEL_TOP + PANEL_HEIGHT + 18.0
        );
    }
}

/// One group of bars in [`render_series_svg`]: a label and one value per series (`None`
/// draws `n/a`).
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesGroup {
    /// The label under the group.
    pub name: String,
    /// One value per series, in the order of the legend.
    pub values: Vec<Option<f64>>,
}

/// Colours of up to six series (`sluice-bench suite`: nginx, haproxy, the Sluice modes).
const SERIES_COLOURS: [&str; 6] = [
    "#9c9c9c", "#59a14f", "#4e79a7", "#76b7b2", "#edc948", "#e15759",
];

/// A grouped bar chart of ratios against a 1.0 reference line (`sluice-bench suite`: each
/// proxy's requests per CPU-second ÷ nginx's, per case and topology). Written by hand like
/// [`render_compare_svg`].
pub fn render_series_svg(title: &str, series: &[String], groups: &[SeriesGroup]) -> String {
    let per_group = series.len().max(1) as f64;
    let bar_w = 22.0;
    let group_w = bar_w * per_group + 30.0;
    let left = 50.0;
    let width = (left + group_w * groups.len().max(1) as f64 + 20.0).max(600.0);
    let (top, plot_h) = (60.0, 260.0);
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().flatten())
        .copied()
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max)
        * 1.15;
    let y_of = |v: f64| top + plot_h - v / max * plot_h;
    let height = top + plot_h + 130.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="#fff"/><text x="{x:.1}" y="24" font-size="14" font-weight="bold" text-anchor="middle">{t}</text>"##,
        x = width / 2.0,
        t = escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{y:.1}" x2="{x2:.1}" y2="{y:.1}" stroke="#333"/>"##,
        y = top + plot_h,
        x2 = width - 10.0
    );
    let y1 = y_of(1.0);
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{y1:.1}" x2="{x2:.1}" y2="{y1:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="4" y="{ty:.1}" font-size="10" fill="#666">1.0</text>"##,
        x2 = width - 10.0,
        ty = y1 + 3.0
    );
    for (i, g) in groups.iter().enumerate() {
        let gx = left + 15.0 + group_w * i as f64;
        for (j, v) in g.values.iter().enumerate() {
            let bx = gx + bar_w * j as f64;
            let colour = SERIES_COLOURS[j % SERIES_COLOURS.len()];
            match v.filter(|v| v.is_finite()) {
                Some(v) => {
                    let y = y_of(v);
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{bx:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{colour}"/><text x="{tx:.1}" y="{ty:.1}" font-size="9" text-anchor="middle">{v:.2}</text>"#,
                        w = bar_w - 3.0,
                        h = top + plot_h - y,
                        tx = bx + (bar_w - 3.0) / 2.0,
                        ty = y - 3.0
                    );
                }
                None => {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{tx:.1}" y="{ty:.1}" font-size="9" fill="#999" text-anchor="middle">n/a</text>"##,
                        tx = bx + (bar_w - 3.0) / 2.0,
                        ty = top + plot_h - 3.0
                    );
                }
            }
        }
        let cx = gx + bar_w * per_group / 2.0;
        let _ = writeln!(
            svg,
            r#"<text x="{cx:.1}" y="{y:.1}" font-size="10" text-anchor="end" transform="rotate(-30 {cx:.1} {y:.1})">{}</text>"#,
            escape(&g.name),
            y = top + plot_h + 14.0
        );
    }
    for (j, name) in series.iter().enumerate() {
        let x = left + 130.0 * j as f64;
        let y = height - 14.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="{ry:.1}" width="10" height="10" fill="{c}"/><text x="{tx:.1}" y="{y:.1}" font-size="11">{n}</text>"#,
            ry = y - 9.0,
            c = SERIES_COLOURS[j % SERIES_COLOURS.len()],
            tx = x + 14.0,
            n = escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Renders A and B side by side as an SVG document (see the module doc).
pub fn render_compare_svg(a: &BenchResult, b: &BenchResult, a_name: &str, b_name: &str) -> String {
    let both = [a, b];
    let per_cpu = |proxy: &'static str| -> Group {
        Group {
            name: proxy,
            bars: both.map(|r| {
                let v = r.metrics(proxy).map(|m| m.requests_per_cpu_second);
                Bar {
                    value: v,
                    label: v.map_or_else(String::new, thousands),
                }
            }),
        }
    };
    let ratio = |name: &'static str, f: fn(&crate::report::Ratios) -> f64| -> Group {
        Group {
            name,
            bars: both.map(|r| {
                let v = r.ratios.as_ref().map(f);
                Bar {
                    value: v,
                    label: v.map_or_else(String::new, |v| format!("{v:.2}×")),
                }
            }),
        }
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="24" font-size="16" font-weight="bold" text-anchor="middle">Sluice vs nginx, scenario {} — two machines</text>"#,
        WIDTH / 2.0,
        a.scenario
    );
    panel(
        &mut svg,
        40.0,
        380.0,
        "requests per CPU-second (higher is better)",
        &[per_cpu("nginx"), per_cpu("sluice")],
        1.0,
        None,
    );
    panel(
        &mut svg,
        480.0,
        380.0,
        "sluice ÷ nginx on the same machine",
        &[
            ratio("req/s", |r| r.requests_per_sec),
            ratio("req/CPU-s", |r| r.requests_per_cpu_second),
            ratio("p99 (lower is better)", |r| r.p99_latency),
        ],
        1.0,
        Some(1.0),
    );
    for (j, (r, file)) in [(a, a_name), (b, b_name)].into_iter().enumerate() {
        let y = HEIGHT - 44.0 + 20.0 * j as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="40" y="{:.1}" width="14" height="14" fill="{}"/><text x="60" y="{y:.1}" font-size="12">{}: {}{}</text>"#,
            y - 11.0,
            COLOURS[j],
            if j == 0 { "A" } else { "B" },
            escape(&machine_label(r, file)),
            match (
                r.ratios.as_ref().is_some_and(|x| x.noisy),
                r.machine.emulation.is_some()
            ) {
                (false, false) => "",
                (true, false) => " — NOISY run",
                (false, true) => " — qemu-user emulation, not a Graviton measurement",
                (true, true) => " — NOISY run, qemu-user emulation, not a Graviton measurement",
            }
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn result() -> BenchResult {
        // NB: read when the test runs; the build cache may come from another clone.
        let path = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
            .join("tests/fixtures/scenario-1-x86_64.json");
        BenchResult::load(&path).unwrap()
    }

    #[test]
    fn series_chart_has_a_bar_per_value_and_a_legend() {
        let svg = render_series_svg(
            "t <&>",
            &["nginx".into(), "sluice (send)".into()],
            &[
                SeriesGroup {
                    name: "keep-alive (origin off)".into(),
                    values: vec![Some(1.0), Some(1.31)],
                },
                SeriesGroup {
                    name: "churn".into(),
                    values: vec![Some(1.0), None],
                },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 2,
            "3 bars, 2 legend boxes"
        );
        assert!(svg.contains(">1.31<"));
        assert!(svg.contains(">n/a<"));
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.contains(">sluice (send)<"));
    }

    #[test]
    fn two_machines_side_by_side() {
        let a = result();
        let mut b = a.clone();
        b.machine.arch = "aarch64".to_owned();
        b.machine.cpu_model = "Neoverse-V1 <ARM>".to_owned();
        let ra = a.ratios.clone().unwrap();
        let mut rb = ra.clone();
        rb.requests_per_cpu_second = 1.37;
        b.ratios = Some(rb);
        let svg = render_compare_svg(&a, &b, "x86.json", "arm.json");
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert!(
            svg.contains("aarch64 · Neoverse-V1 &lt;ARM&gt; · "),
            "{svg}"
        );
        assert!(svg.contains("x86_64 · "), "{svg}");
        assert!(svg.contains(">1.37×<"), "{svg}");
        assert!(
            svg.contains(&format!(">{:.2}×<", ra.requests_per_cpu_second)),
            "{svg}"
        );
        let nginx = a.metrics("nginx").unwrap().requests_per_cpu_second;
        assert!(svg.contains(&format!(">{}<", thousands(nginx))), "{svg}");
        assert!(svg.contains("nginx = 1"), "{svg}");
        // Every opened element is closed: 2 bars × (2 + 3) groups.
        assert_eq!(svg.matches("<rect x=").count() - 2, 10, "{svg}");
    }

    #[test]
    fn an_emulated_machine_is_labelled() {
        let a = result();
        let mut b = a.clone();
        b.machine.emulation = crate::machine::emulation(
            "aarch64",
            "x86_64",
            Some("aarch64"),
            Some("qemu-aarch64-static (qemu-aarch64 version 7.2.22)".into()),
        );
        b.machine.arch = "aarch64".to_owned();
        let svg = render_compare_svg(&a, &b, "x86.json", "arm-qemu.json");
        assert!(
            svg.contains("aarch64 under qemu-user on x86_64 · "),
            "{svg}"
        );
        assert_eq!(
            svg.matches("qemu-user emulation, not a Graviton measurement")
                .count(),
            1,
            "{svg}"
        );
    }

    #[test]
    fn a_machine_without_sluice_shows_na() {
        let a = result();
        let mut b = a.clone();
        b.runs.retain(|r| r.proxy == "nginx");
        b.ratios = None;
        let svg = render_compare_svg(&a, &b, "a.json", "b.json");
        assert_eq!(svg.matches(">n/a<").count(), 4, "{svg}");
    }
}
