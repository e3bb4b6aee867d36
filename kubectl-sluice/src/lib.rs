//! `kubectl-sluice`: answers "is this configuration valid, which route serves this request,
//! and what changes if I apply it?" with the controller's translate function and the
//! dataplane's router and snapshot compiler, never a second implementation of either.
//!
//! ```text
//! -f FILES ─▶ files::Loaded ─▶ translate() ─▶ Snapshot ─▶ RouteTable::compile (dataplane)
//!                 │                 │                            │
//!                 ▼                 ▼                            ▼
//!            validate (rejected objects, warnings)   explain (Router::explain)   diff
//! ```
//!
//! `main.rs` only wires parts (flags are in `cli`); every subcommand is a function here returning a report that
//! serialises (`-o json|yaml`) and renders as text.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod completion;
pub mod diff;
pub mod explain;
pub mod explain_stream;
pub mod migrate;
pub mod offline;
pub mod status;
pub mod synthetic;
pub mod table;
pub mod terminal;
pub mod validate;

/// Output format of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Human-readable text (default).
    #[default]
    Text,
    /// JSON, for scripts.
    Json,
    /// YAML, for scripts.
    Yaml,
}

/// Renders `report` as JSON or YAML (`Format::Text` is the caller's job).
pub fn render_structured<T: serde::Serialize>(report: &T, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(report)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}\n")),
        Format::Yaml | Format::Text => {
            serde_yaml::to_string(report).unwrap_or_else(|e| format!("error: {e}\n"))
        }
    }
}
