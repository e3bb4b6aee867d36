//! Facts about the machine and tools a result was measured with.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Machine and tool versions recorded in every result file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// CPU architecture as `uname -m` spells it (`x86_64`, `aarch64`).
    pub arch: String,
    /// Number of online CPUs available to the harness.
    pub nproc: usize,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// CPU model name from /proc/cpuinfo or lscpu; `unknown` if neither says.
    pub cpu_model: String,
    /// `nginx -v`, e.g. `nginx/1.22.1`.
    pub nginx_version: String,
    /// First line of `wrk -v`.
    pub wrk_version: String,
    /// `git rev-parse HEAD` of the workspace, `unknown` outside git or before the first commit.
    pub git_commit: String,
    /// True when the work tree had uncommitted changes.
    pub git_dirty: bool,
}

/// CPU architecture in `uname -m` spelling.
pub fn arch() -> String {
    std::env::consts::ARCH.to_owned()
}

/// Collects machine facts; tool versions come from the given binaries.
pub fn collect(workspace: &Path, nginx_version: String, wrk_version: String) -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpu_model_from_cpuinfo(&cpuinfo)
        .or_else(|| {
            let out = Command::new("lscpu").output().ok()?;
            cpu_model_from_lscpu(&String::from_utf8_lossy(&out.stdout))
        })
        .unwrap_or_else(|| "unknown".into());
    let git_commit = run_trimmed(
        Command::new("git")
            .arg("-C")
            .arg(workspace)
            .args(["rev-parse", "HEAD"]),
    )
    .filter(|s| s.len() >= 7 && s.bytes().all(|b| b.is_ascii_hexdigit()))
    .unwrap_or_else(|| "unknown".into());
    let git_dirty = run_trimmed(Command::new("git").arg("-C").arg(workspace).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]))
    .is_some_and(|s| !s.is_empty());
    MachineInfo {
        arch: arch(),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
        cpu_model,
        nginx_version,
        wrk_version,
        git_commit,
        git_dirty,
    }
}

/// Runs a command and returns its trimmed stdout when it succeeds.
pub fn run_trimmed(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `model name` on x86; arm64 kernels usually print no model name, so fall
/// back to lscpu there.
pub fn cpu_model_from_cpuinfo(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "model name" && !value.trim().is_empty()).then(|| value.trim().to_owned())
    })
}

/// `Model name:` (plus `Vendor ID:` when present) from `lscpu`, e.g.
/// `ARM Neoverse-V1`.
pub fn cpu_model_from_lscpu(lscpu: &str) -> Option<String> {
    let field = |name: &str| {
        lscpu.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name && !value.trim().is_empty() && value.trim() != "-")
                .then(|| value.trim().to_owned())
        })
    };
    let model = field("Model name")?;
    match field("Vendor ID") {
        // x86 vendor ids (GenuineIntel, AuthenticAMD) are already in the model name.
        Some(vendor)
            if !model.starts_with(&vendor)
                && !vendor.starts_with("Genuine")
                && !vendor.starts_with("Authentic") =>
        {
            Some(format!("{vendor} {model}"))
        }
        _ => Some(model),
    }
}

/// First line of `wrk -v` (wrk prints it and then exits 1).
pub fn wrk_version(wrk: &Path) -> String {
    Command::new(wrk)
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            parse_wrk_version(&text)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Extracts `wrk debian/4.1.0-3+b2 [epoll]` from the banner line.
pub fn parse_wrk_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("wrk "))?;
    Some(
        line.split(" Copyright")
            .next()
            .unwrap_or(line)
            .trim()
            .to_owned(),
    )
}

/// UTC time as `YYYYMMDDTHHMMSSZ` (compact, sortable, safe in file names).
pub fn timestamp_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        assert_eq!(timestamp_utc(UNIX_EPOCH), "19700101T000000Z");
        // 2000-02-29 12:34:56 UTC (leap day)
        assert_eq!(
            timestamp_utc(UNIX_EPOCH + Duration::from_secs(951_827_696)),
            "20000229T123456Z"
        );
        // 2024-12-31 23:59:59 UTC
        assert_eq!(
            timestamp_utc(UNIX_EPOCH + Duration::from_secs(1_735_689_599)),
            "20241231T235959Z"
        );
    }

    #[test]
    fn cpu_model_x86_and_arm() {
        let x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7R13\n";
        assert_eq!(
            cpu_model_from_cpuinfo(x86).as_deref(),
            Some("AMD EPYC 7R13")
        );
        let arm = "processor\t: 0\nBogoMIPS\t: 243.75\nCPU part\t: 0xd40\n";
        assert_eq!(cpu_model_from_cpuinfo(arm), None);
        let lscpu = "Architecture:  aarch64\nVendor ID:     ARM\nModel name:    Neoverse-V1\n";
        assert_eq!(
            cpu_model_from_lscpu(lscpu).as_deref(),
            Some("ARM Neoverse-V1")
        );
        let lscpu_x86 = "Vendor ID:     AuthenticAMD\nModel name:    AMD EPYC\n";
        assert_eq!(cpu_model_from_lscpu(lscpu_x86).as_deref(), Some("AMD EPYC"));
    }

    #[test]
    fn wrk_banner() {
        let text = "wrk debian/4.1.0-3+b2 [epoll] Copyright (C) 2012 Will Glozer\nUsage: wrk <options> <url>\n";
        assert_eq!(
            parse_wrk_version(text).as_deref(),
            Some("wrk debian/4.1.0-3+b2 [epoll]")
        );
        assert_eq!(parse_wrk_version("command not found"), None);
    }
}
