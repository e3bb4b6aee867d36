//! `sluice-bench suite --perf DIR`: a `perf record` profile of each proxy's measured runs,
//! and its summary, the evidence of where a proxy's CPU goes in a scenario.
//!
//! Per measured run: `perf record -F 499 --call-graph dwarf` on the proxy's process tree
//! for the length of the run, then `perf report` into `<stem>.txt`: the share of samples
//! per binary (kernel against user space), the top symbols by self time, and the top
//! symbols by inclusive time (each with what it calls). The sampling perturbs the figures; a
//! profiled run is not a figure of record.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::BenchError;
use crate::process::ProcessGuard;
use crate::procfs;
use crate::suite::Topology;

/// Samples per second (a prime, off the timer ticks).
const FREQUENCY: &str = "499";

/// File name stem of a profile: `churn-off-plain-new-connection-per-request-sluice-send`.
pub fn file_stem(
    scenario: &str,
    topology: Topology,
    case: &str,
    proxy: &str,
    idle_connections: u64,
) -> String {
    let topo = match topology {
        Topology::OriginOnProxyCore => "on",
        Topology::OriginOffProxyCore => "off",
        Topology::Unpinned => "unpinned",
    };
    let mut stem = format!("{scenario}-{topo}-{}-{}", slug(case), slug(proxy));
    if idle_connections > 0 {
        stem.push_str(&format!("-{idle_connections}-idle"));
    }
    stem
}

/// Lower-case letters and digits, other runs of characters as one `-`.
fn slug(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

/// A `perf record` running on a proxy's process tree.
pub struct Recording {
    guard: ProcessGuard,
    data: PathBuf,
    summary: PathBuf,
}

impl Recording {
    /// Starts recording the process tree of `root` into `dir/<stem>.perf.data`.
    pub fn start(dir: &Path, stem: &str, root: u32) -> Result<Self, BenchError> {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io("create dir", dir, e))?;
        let pids: Vec<String> = procfs::tree_members(root, &procfs::all_processes())
            .iter()
            .map(u32::to_string)
            .collect();
        let data = dir.join(format!("{stem}.perf.data"));
        let mut cmd = Command::new("perf");
        cmd.args([
            "record",
            "-q",
            "-F",
            FREQUENCY,
            "--call-graph",
            "dwarf,16384",
        ])
        .arg("-p")
        .arg(pids.join(","))
        .arg("-o")
        .arg(&data);
        let guard = ProcessGuard::spawn("perf record", cmd, &dir.join(format!("{stem}.perf.log")))?;
        // NB: perf attaches within milliseconds; the run's warm-up already passed.
        std::thread::sleep(Duration::from_millis(200));
        Ok(Self {
            guard,
            data,
            summary: dir.join(format!("{stem}.txt")),
        })
    }

    /// Stops the recording (SIGINT, as Ctrl-C), writes the summary and returns its path.
    pub fn finish(mut self) -> Result<PathBuf, BenchError> {
        self.guard.interrupt();
        if self.guard.wait_timeout(Duration::from_secs(60)).is_none() {
            return Err(BenchError::NotReady {
                what: "perf record".into(),
                detail: format!("did not stop on SIGINT; {}", self.guard.log_tail(5)),
            });
        }
        let mut text = String::new();
        for (title, args) in [
            (
                "samples per binary (kernel = system calls, interrupts and the network stack)",
                &["--no-children", "--sort", "dso", "--percent-limit", "0.5"][..],
            ),
            (
                "top symbols by self time",
                &[
                    "--no-children",
                    "--sort",
                    "dso,sym",
                    "--percent-limit",
                    "0.7",
                ][..],
            ),
            (
                "top symbols by inclusive time (the symbol and what it calls)",
                &["--children", "--sort", "sym", "--percent-limit", "4"][..],
            ),
        ] {
            let out = Command::new("perf")
                .args(["report", "--stdio", "-g", "none", "-i"])
                .arg(&self.data)
                .args(args)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map_err(|e| BenchError::Spawn {
                    what: "perf report".into(),
                    source: e,
                })?;
            text.push_str(&format!("## {title}\n\n"));
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // The header comments repeat per report; keep the sample count only.
                if line.starts_with("# Samples") || !line.starts_with('#') && !line.is_empty() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
            text.push('\n');
        }
        std::fs::write(&self.summary, text)
            .map_err(|e| BenchError::io("write", &self.summary, e))?;
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_name_scenario_topology_case_and_proxy() {
        assert_eq!(
            file_stem(
                "churn",
                Topology::OriginOffProxyCore,
                "plain, new connection per request",
                "sluice (send)",
                0
            ),
            "churn-off-plain-new-connection-per-request-sluice-send"
        );
        assert_eq!(
            file_stem(
                "idle",
                Topology::OriginOnProxyCore,
                "keep-alive GET /hello",
                "nginx",
                9000
            ),
            "idle-on-keep-alive-get-hello-nginx-9000-idle"
        );
    }
}
