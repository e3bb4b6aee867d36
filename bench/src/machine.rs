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
    /// Online CPUs of the machine (`/sys/devices/system/cpu/online`). NB: not the
    /// harness's own affinity, which pins it to one CPU before this is collected (results
    /// before 2026-12-03 evening say `1 CPUs` on a 2-CPU machine).
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
    /// Set when the measured sluice-dataplane did not run as native code on this machine
    /// (user-mode emulation such as qemu-user); absent in native results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation: Option<Emulation>,
}

/// How an emulated run was made: which architecture's code ran on which host, through what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Emulation {
    /// Architecture of the sluice-dataplane binary (from its ELF header), e.g. `aarch64`.
    pub guest_arch: String,
    /// Architecture of the host kernel (`uname -m` of a native process), e.g. `x86_64`.
    pub host_arch: String,
    /// The emulator and its version, e.g. `qemu-aarch64-static (qemu-aarch64 version 7.2.22)`.
    pub emulator: String,
    /// True when sluice-bench itself also ran emulated (its own architecture is not the host's).
    pub harness_emulated: bool,
}

impl MachineInfo {
    /// The architecture part of result file names: `arch` for native runs,
    /// `<guest>-qemu` (or `<guest>-emulated`) for emulated ones, so an emulated result
    /// never takes the place of a native one (`latest-1-aarch64.json`).
    pub fn file_arch(&self) -> String {
        match &self.emulation {
            None => self.arch.clone(),
            Some(e) if e.emulator.contains("qemu") => format!("{}-qemu", e.guest_arch),
            Some(e) => format!("{}-emulated", e.guest_arch),
        }
    }

    /// A one-line description of the architecture for reports and charts, e.g. `x86_64`
    /// or `aarch64 under qemu-user on x86_64`.
    pub fn arch_label(&self) -> String {
        match &self.emulation {
            None => self.arch.clone(),
            Some(e) => format!(
                "{} under {} on {}",
                e.guest_arch,
                if e.emulator.contains("qemu") {
                    "qemu-user"
                } else {
                    "emulation"
                },
                e.host_arch
            ),
        }
    }
}

/// The architecture (`uname -m` spelling) an ELF executable was built for, from its header;
/// `None` for anything else.
pub fn elf_arch(header: &[u8]) -> Option<&'static str> {
    if header.len() < 20 || header[..4] != *b"\x7fELF" {
        return None;
    }
    let machine = match header[5] {
        1 => u16::from_le_bytes([header[18], header[19]]),
        2 => u16::from_be_bytes([header[18], header[19]]),
        _ => return None,
    };
    Some(match machine {
        0x03 => "i686",
        0x28 => "arm",
        0x3e => "x86_64",
        0xb7 => "aarch64",
        0xf3 => "riscv64",
        0x16 => "s390x",
        0x15 => "ppc64le",
        _ => return None,
    })
}

/// The architecture of the binary at `path` (see [`elf_arch`]).
pub fn binary_arch(path: &Path) -> Option<&'static str> {
    use std::io::Read as _;
    let mut header = [0u8; 20];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .ok()?;
    elf_arch(&header)
}

/// The host kernel's architecture: `uname -m` run as a separate program. Under user-mode
/// emulation that program is the host's own (native) `uname`, so this names the real machine
/// even when sluice-bench itself is emulated; falls back to the harness's own architecture.
pub fn host_arch() -> String {
    run_trimmed(Command::new("uname").arg("-m"))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(arch)
}

/// Decides whether a run is emulated: when `emulator` runs the dataplane, when the dataplane
/// binary is for another architecture than the host, or when sluice-bench itself is not
/// native (`harness_arch` differs from `host_arch`). `emulator_version` describes the
/// emulator (its name and `--version`).
pub fn emulation(
    harness_arch: &str,
    host_arch: &str,
    dataplane_arch: Option<&str>,
    emulator_version: Option<String>,
) -> Option<Emulation> {
    let harness_emulated = harness_arch != host_arch;
    let foreign_dataplane = dataplane_arch.is_some_and(|a| a != host_arch);
    if emulator_version.is_none() && !harness_emulated && !foreign_dataplane {
        return None;
    }
    Some(Emulation {
        guest_arch: dataplane_arch.unwrap_or(harness_arch).to_owned(),
        host_arch: host_arch.to_owned(),
        emulator: emulator_version.unwrap_or_else(|| {
            "the kernel's binfmt_misc interpreter (probably qemu-user)".to_owned()
        }),
        harness_emulated,
    })
}

/// `NAME (first line of NAME --version)` of an emulator such as qemu-aarch64-static.
pub fn emulator_version(emulator: &Path) -> String {
    let name = emulator.file_name().map_or_else(
        || emulator.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let version = run_trimmed(Command::new(emulator).arg("--version"))
        .and_then(|v| v.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "version unknown".to_owned());
    format!("{name} ({version})")
}

/// CPU architecture in `uname -m` spelling.
pub fn arch() -> String {
    std::env::consts::ARCH.to_owned()
}

/// Collects machine facts; tool versions come from the given binaries. With `emulation`,
/// `arch` is the emulated (guest) architecture and the CPU model is the host's.
pub fn collect(
    workspace: &Path,
    nginx_version: String,
    wrk_version: String,
    emulation: Option<Emulation>,
) -> MachineInfo {
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
        arch: emulation
            .as_ref()
            .map_or_else(arch, |e| e.guest_arch.clone()),
        nproc: std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|l| cpus_in_list(&l))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
        cpu_model,
        nginx_version,
        wrk_version,
        git_commit,
        git_dirty,
        emulation,
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

/// CPUs in a kernel CPU list such as `0-1` or `0,2-5` (`/sys/devices/system/cpu/online`).
pub fn cpus_in_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                b.parse::<usize>()
                    .ok()?
                    .checked_sub(a.parse::<usize>().ok()?)?
                    + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
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
    fn cpu_lists_count_ranges_and_singles() {
        assert_eq!(cpus_in_list("0-1\n"), Some(2));
        assert_eq!(cpus_in_list("0"), Some(1));
        assert_eq!(cpus_in_list("0,2-5,7"), Some(6));
        assert_eq!(cpus_in_list(""), None);
        assert_eq!(cpus_in_list("3-1"), None);
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
    fn elf_headers_name_their_architecture() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[5] = 1;
        h[18] = 0xb7;
        assert_eq!(elf_arch(&h), Some("aarch64"));
        h[18] = 0x3e;
        assert_eq!(elf_arch(&h), Some("x86_64"));
        assert_eq!(elf_arch(b"#!/bin/sh\nexec something else\n"), None);
        // The test binary itself is native.
        let me = std::env::current_exe().unwrap();
        assert_eq!(binary_arch(&me), Some(std::env::consts::ARCH));
    }

    #[test]
    fn emulated_runs_are_detected_and_labelled() {
        // Native: nothing to say.
        assert_eq!(emulation("x86_64", "x86_64", Some("x86_64"), None), None);
        // Native harness, arm64 dataplane through an explicit emulator.
        let e = emulation(
            "x86_64",
            "x86_64",
            Some("aarch64"),
            Some("qemu-aarch64-static (qemu-aarch64 version 7.2.22)".into()),
        )
        .unwrap();
        assert_eq!(
            (e.guest_arch.as_str(), e.harness_emulated),
            ("aarch64", false)
        );
        // arm64 harness under qemu on an x86_64 kernel, interpreter from binfmt_misc.
        let e = emulation("aarch64", "x86_64", Some("aarch64"), None).unwrap();
        assert!(e.harness_emulated);
        assert!(e.emulator.contains("binfmt_misc"), "{}", e.emulator);

        let mut m = collect(
            Path::new("/nonexistent"),
            "nginx".into(),
            "wrk".into(),
            None,
        );
        assert_eq!(m.file_arch(), std::env::consts::ARCH);
        assert_eq!(m.arch_label(), std::env::consts::ARCH);
        m.emulation = emulation(
            "aarch64",
            "x86_64",
            Some("aarch64"),
            Some("qemu-aarch64-static (qemu-aarch64 version 7.2.22)".into()),
        );
        assert_eq!(m.file_arch(), "aarch64-qemu");
        assert_eq!(m.arch_label(), "aarch64 under qemu-user on x86_64");
        // Old result files have no emulation field and still load as native.
        let mut v = serde_json::to_value(&m).unwrap();
        v.as_object_mut().unwrap().remove("emulation");
        let old: MachineInfo = serde_json::from_value(v).unwrap();
        assert_eq!(old.emulation, None);
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
