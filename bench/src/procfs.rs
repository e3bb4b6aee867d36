//! CPU time and peak memory of a process tree, read from `/proc`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::BenchError;

/// The fields of `/proc/<pid>/stat` the harness uses. Times are in clock ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id (field 1).
    pub pid: u32,
    /// Executable name without the parentheses (field 2); may contain spaces.
    pub comm: String,
    /// State letter (field 3): R, S, D, Z (zombie), ...
    pub state: char,
    /// Parent process id (field 4).
    pub ppid: u32,
    /// Process group id (field 5).
    pub pgrp: u32,
    /// User-mode CPU time (field 14).
    pub utime: u64,
    /// Kernel-mode CPU time (field 15).
    pub stime: u64,
    /// User time of waited-for children (field 16).
    pub cutime: u64,
    /// Kernel time of waited-for children (field 17).
    pub cstime: u64,
}

impl ProcStat {
    /// CPU ticks of the process itself plus its already reaped children, so a
    /// worker that exits during a measurement is still counted via its parent.
    pub fn total_ticks(&self) -> u64 {
        self.utime + self.stime + self.cutime + self.cstime
    }
}

/// Parses the single line of `/proc/<pid>/stat`. The command name sits in
/// parentheses and may itself contain spaces and `)`, so fields are counted
/// from the last `)`.
pub fn parse_stat(content: &str) -> Result<ProcStat, BenchError> {
    let bad = |why: &str| BenchError::ProcFormat(format!("{why} in stat line {content:?}"));
    let open = content.find('(').ok_or_else(|| bad("no '('"))?;
    let close = content.rfind(')').ok_or_else(|| bad("no ')'"))?;
    if close < open {
        return Err(bad("')' before '('"));
    }
    let pid = content[..open].trim().parse().map_err(|_| bad("bad pid"))?;
    let comm = content[open + 1..close].to_owned();
    // Field 3 (state) is rest[0], so field N is rest[N - 3].
    let rest: Vec<&str> = content[close + 1..].split_whitespace().collect();
    let field = |n: usize| -> Result<u64, BenchError> {
        rest.get(n - 3)
            .ok_or_else(|| bad(&format!("missing field {n}")))?
            .parse()
            .map_err(|_| bad(&format!("non-numeric field {n}")))
    };
    let state = rest
        .first()
        .and_then(|s| s.chars().next())
        .ok_or_else(|| bad("missing state"))?;
    let ppid = u32::try_from(field(4)?).map_err(|_| bad("ppid out of range"))?;
    let pgrp = u32::try_from(field(5)?).map_err(|_| bad("pgrp out of range"))?;
    Ok(ProcStat {
        pid,
        comm,
        state,
        ppid,
        pgrp,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// Reads `VmHWM` (peak resident set size) in KiB from the text of `/proc/<pid>/status`.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    parse_status_kib(status, "VmHWM")
}

/// Reads the `<field>:  <n> kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, ...) in KiB.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut parts = value.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | None => Some(n),
            _ => None,
        }
    })
}

/// Memory and open files of one process, from `/proc/<pid>/status` and `/proc/<pid>/fd`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcMemory {
    /// Process id.
    pub pid: u32,
    /// Executable name (`comm`), e.g. `nginx`, `sluice-dataplan`.
    pub comm: String,
    /// Resident set size now (`VmRSS`), KiB.
    pub rss_kib: u64,
    /// Peak resident set size since start (`VmHWM`), KiB.
    pub hwm_kib: u64,
    /// Open file descriptors (entries of `/proc/<pid>/fd`; sockets included).
    pub fds: u64,
}

/// [`ProcMemory`] of `root` and each live descendant (root first), e.g. an nginx master and
/// its worker. Processes that vanish while being read are left out.
pub fn tree_memory(root: u32) -> Vec<ProcMemory> {
    let all = all_processes();
    tree_members(root, &all)
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let comm = all
                .iter()
                .find(|p| p.pid == pid)
                .map_or_else(String::new, |p| p.comm.clone());
            Some(ProcMemory {
                pid,
                comm,
                rss_kib: parse_status_kib(&status, "VmRSS")?,
                hwm_kib: parse_status_kib(&status, "VmHWM")?,
                fds: open_fds(pid).unwrap_or(0),
            })
        })
        .collect()
}

/// Sum of `VmRSS` over `root` and its live descendants, in KiB: `/proc/<pid>/status` only.
///
/// This is what a sampler polling during a measured run reads. It does not list
/// `/proc/<pid>/fd` as [`tree_memory`] does: for a proxy holding 9,000 idle connections that
/// listing takes about 9 ms of the reader's CPU, and the suite samples every 50 ms on the
/// load generator's core, which slowed the load (and raised every proxy's p99) in the
/// idle-connection scenario.
pub fn tree_rss_kib(root: u32) -> u64 {
    let all = all_processes();
    tree_members(root, &all)
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            parse_status_kib(&status, "VmRSS")
        })
        .sum()
}

/// Number of open file descriptors of `pid`; `None` if `/proc/<pid>/fd` cannot be read
/// (another user's process without privileges).
pub fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// The soft and hard `Max open files` limits from the text of `/proc/<pid>/limits`;
/// `u64::MAX` stands for `unlimited`.
pub fn parse_nofile_limits(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut values = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| match v {
            "unlimited" => Some(u64::MAX),
            v => v.parse().ok(),
        });
    Some((values.next()??, values.next()??))
}

/// Returns `root` and every process below it, given a snapshot of all processes.
pub fn tree_members(root: u32, all: &[ProcStat]) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in all {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut out = vec![root];
    let mut i = 0;
    while let Some(&pid) = out.get(i) {
        if let Some(kids) = children.get(&pid) {
            for &k in kids {
                // NB: pid reuse could in theory create a cycle; never visit twice.
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        i += 1;
    }
    out
}

/// Reads the stat line of every process currently visible in `/proc`.
/// Processes that vanish while being read are skipped.
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s).ok())
        .collect()
}

/// True while any non-zombie process belongs to process group `pgid`.
pub fn group_alive(pgid: u32) -> bool {
    all_processes()
        .iter()
        .any(|p| p.pgrp == pgid && p.state != 'Z')
}

/// Total CPU ticks (user + system, including reaped children) of `root` and
/// all its live descendants, e.g. an nginx master and its workers.
pub fn tree_cpu_ticks(root: u32) -> u64 {
    let all = all_processes();
    let members = tree_members(root, &all);
    all.iter()
        .filter(|p| members.contains(&p.pid))
        .map(ProcStat::total_ticks)
        .sum()
}

/// Clock ticks spent in the kernel (system time) by `root` and its live descendants.
pub fn tree_system_ticks(root: u32) -> u64 {
    let all = all_processes();
    let members = tree_members(root, &all);
    all.iter()
        .filter(|p| members.contains(&p.pid))
        .map(|p| p.stime + p.cstime)
        .sum()
}

/// Sum of `VmHWM` over `root` and its live descendants, in KiB.
pub fn tree_peak_rss_kib(root: u32) -> u64 {
    let all = all_processes();
    tree_members(root, &all)
        .iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|s| parse_vm_hwm_kib(&s))
        .sum()
}

/// Machine-wide CPU time from the aggregate `cpu` line of `/proc/stat`, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SystemCpu {
    /// user + nice + system + irq + softirq + steal (guest time is already part of user).
    pub busy: u64,
    /// Time the hypervisor ran something else while this VM wanted to run.
    pub steal: u64,
}

/// Parses the aggregate `cpu  user nice system idle iowait irq softirq steal ...` line.
pub fn parse_system_cpu(proc_stat: &str) -> Option<SystemCpu> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    if v.len() < 4 {
        return None;
    }
    Some(SystemCpu {
        busy: at(0) + at(1) + at(2) + at(5) + at(6) + at(7),
        steal: at(7),
    })
}

/// Current machine-wide CPU time; zeros if /proc/stat is unreadable.
pub fn system_cpu() -> SystemCpu {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| parse_system_cpu(&s))
        .unwrap_or_default()
}

/// CPU ticks of this process's reaped children (e.g. a finished wrk run).
pub fn own_reaped_children_ticks() -> u64 {
    reaped_children_ticks(&own_main_thread_stat())
        .or_else(|| reaped_children_ticks(Path::new("/proc/self/stat")))
        .unwrap_or(0)
}

/// `/proc/<pid>/task/<pid>/stat` of this process's main thread. Its cutime/cstime are the
/// whole process's (the kernel reads them from the shared signal struct). NB: not
/// `/proc/self/stat`, which qemu-user fakes (zeros) when sluice-bench itself runs emulated.
pub fn own_main_thread_stat() -> PathBuf {
    let pid = std::process::id();
    PathBuf::from(format!("/proc/{pid}/task/{pid}/stat"))
}

/// cutime + cstime from a stat file; `None` if it cannot be read or parsed.
pub fn reaped_children_ticks(stat: &Path) -> Option<u64> {
    std::fs::read_to_string(stat)
        .ok()
        .and_then(|s| parse_stat(&s).ok())
        .map(|s| s.cutime + s.cstime)
}

/// The time a `/proc/<pid>/task/<tid>/schedstat` line says the thread ran, in ns (its
/// first field).
pub fn parse_schedstat_ns(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

/// CPU time of `pid`'s live threads in nanoseconds (user + system, from the scheduler's
/// own accounting), or `None` if it cannot be read. NB: finer than the 10 ms ticks of
/// `/proc/<pid>/stat` (0.3% of a 3 CPU-second share); threads that exit are not counted,
/// so use it for long-lived processes without children (a dataplane under load).
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks {
        let path = task.ok()?.path().join("schedstat");
        total += parse_schedstat_ns(&std::fs::read_to_string(path).ok()?)?;
    }
    Some(total)
}

/// Clock ticks per second (`getconf CLK_TCK`); 100 — the Linux value on every
/// common architecture — if getconf is unavailable.
pub fn clock_ticks_per_sec() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_nanoseconds_on_cpu() {
        assert_eq!(parse_schedstat_ns("341555 146747 2\n"), Some(341_555));
        assert_eq!(parse_schedstat_ns(""), None);
        // This process has run, and its count only grows.
        let me = std::process::id();
        let before = process_cpu_ns(me).unwrap();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_ns(me).unwrap() > before);
    }

    // A real nginx worker line (fields 1..=52).
    const NGINX_WORKER: &str = "4242 (nginx) S 4241 4241 4241 0 -1 4194624 300 0 0 0 \
        731 269 5 7 20 0 1 0 123456 12345678 900 18446744073709551615 1 1 0 0 0 0 0 \
        1073745920 402745863 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn parses_plain_stat_line() {
        let s = parse_stat(NGINX_WORKER).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm, "nginx");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 4241);
        assert_eq!(s.pgrp, 4241);
        assert_eq!((s.utime, s.stime, s.cutime, s.cstime), (731, 269, 5, 7));
        assert_eq!(s.total_ticks(), 1012);
    }

    #[test]
    fn comm_with_spaces_and_parens() {
        let line = NGINX_WORKER.replace("(nginx)", "(tokio (rt) w 1)");
        let s = parse_stat(&line).unwrap();
        assert_eq!(s.comm, "tokio (rt) w 1");
        assert_eq!(s.ppid, 4241);
        assert_eq!(s.utime, 731);
        assert_eq!(s.stime, 269);
    }

    #[test]
    fn children_ticks_come_from_the_main_thread_stat() {
        let path = own_main_thread_stat();
        assert_eq!(
            path,
            PathBuf::from(format!("/proc/{0}/task/{0}/stat", std::process::id()))
        );
        // The file exists and parses (natively and under qemu-user, which fakes only
        // /proc/self/stat and /proc/<pid>/stat).
        assert!(reaped_children_ticks(&path).is_some());
        assert_eq!(reaped_children_ticks(Path::new("/nonexistent/stat")), None);
    }

    #[test]
    fn truncated_line_is_an_error() {
        assert!(parse_stat("12 (x) S 1 2 3").is_err());
        assert!(parse_stat("garbage").is_err());
        assert!(parse_stat("").is_err());
    }

    #[test]
    fn reads_own_stat() {
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let s = parse_stat(&own).unwrap();
        assert_eq!(s.pid, std::process::id());
    }

    #[test]
    fn status_fields_and_own_tree() {
        let status = "Name:\tsluice\nVmHWM:\t  9000 kB\nVmRSS:\t  7000 kB\nRssAnon:\t 10 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(7000));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(9000));
        assert_eq!(parse_status_kib(status, "Vm"), None);
        let me = tree_memory(std::process::id());
        assert_eq!(me[0].pid, std::process::id());
        assert!(
            me[0].rss_kib > 0 && me[0].hwm_kib >= me[0].rss_kib,
            "{me:?}"
        );
        assert!(me[0].fds >= 3, "{me:?}");
        let rss = tree_rss_kib(std::process::id());
        assert!(rss > 0, "{rss}");
    }

    #[test]
    fn nofile_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
            Max processes             95793                95793                processes \n\
            Max open files            1024                 524288               files     \n";
        assert_eq!(parse_nofile_limits(limits), Some((1024, 524_288)));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_nofile_limits(unlimited), Some((u64::MAX, u64::MAX)));
        assert_eq!(parse_nofile_limits("Max processes 1 1 processes\n"), None);
    }

    #[test]
    fn vm_hwm() {
        let status = "Name:\tnginx\nVmPeak:\t  20000 kB\nVmHWM:\t    5124 kB\nVmRSS:\t 5000 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(5124));
        assert_eq!(parse_vm_hwm_kib("Name:\tkthreadd\n"), None);
        assert_eq!(parse_vm_hwm_kib("VmHWM:\t 12 MB\n"), None);
    }

    fn stat(pid: u32, ppid: u32) -> ProcStat {
        ProcStat {
            pid,
            comm: "x".into(),
            state: 'S',
            ppid,
            pgrp: 0,
            utime: 0,
            stime: 0,
            cutime: 0,
            cstime: 0,
        }
    }

    #[test]
    fn tree_includes_grandchildren_but_not_siblings() {
        let all = vec![
            stat(1, 0),
            stat(10, 1),
            stat(11, 10),
            stat(12, 10),
            stat(13, 11),
            stat(20, 1),
        ];
        let mut t = tree_members(10, &all);
        t.sort_unstable();
        assert_eq!(t, vec![10, 11, 12, 13]);
        assert_eq!(tree_members(99, &all), vec![99]);
    }

    #[test]
    fn system_cpu_line() {
        let stat =
            "cpu  237237 5 29736 55083 1722 10 3101 804 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n";
        let c = parse_system_cpu(stat).unwrap();
        assert_eq!(c.busy, 237_237 + 5 + 29_736 + 10 + 3_101 + 804);
        assert_eq!(c.steal, 804);
        // Old kernels print fewer columns.
        assert_eq!(parse_system_cpu("cpu  10 0 5 100\n").unwrap().busy, 15);
        assert_eq!(parse_system_cpu("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_system_cpu("cpu  1 x 3 4\n"), None);
        assert!(system_cpu().busy > 0);
    }

    #[test]
    fn clock_ticks_is_positive() {
        assert!(clock_ticks_per_sec() > 0);
    }
}
