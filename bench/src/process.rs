//! Child processes and temp dirs that are always cleaned up: on normal
//! return, on error (Drop) and on Ctrl-C / SIGTERM (signal thread).
//!
//! Every child is started in its own process group, so stopping it also stops
//! whatever it forked (nginx workers), and a Ctrl-C in the terminal reaches
//! only the harness, which then stops the groups in order.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::BenchError;
use crate::procfs;

/// Process groups and directories to clean up if a signal arrives.
#[derive(Default)]
struct Registry {
    groups: Vec<u32>,
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    groups: Vec::new(),
    dirs: Vec::new(),
});
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn with_registry(f: impl FnOnce(&mut Registry)) {
    // A poisoned lock only means another thread panicked mid-update; the
    // list is still the best we have for cleaning up.
    let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard);
}

/// True once SIGINT/SIGTERM/SIGHUP was received.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Sends `signal` (e.g. "TERM", "KILL") to every process in group `pgid`
/// via the `kill` utility (std has no safe kill-by-pid). Returns true when
/// `kill` succeeded, i.e. at least one process of the group existed.
fn signal_group(pgid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Stops a whole process group: TERM, wait up to `grace` for every member
/// to exit (zombies count as exited), then KILL. `reap` is called while
/// waiting so the caller can collect its own child.
fn stop_group(pgid: u32, grace: Duration, mut reap: impl FnMut()) {
    if !procfs::group_alive(pgid) {
        return;
    }
    signal_group(pgid, "TERM");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        reap();
        if !procfs::group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(pgid, "KILL");
}

/// Installs a thread that, on SIGINT, SIGTERM or SIGHUP, stops all running
/// children, removes the temp dirs and exits with status 130. Returns once
/// the handlers are in place, so no signal can slip through in between.
pub fn install_signal_handler() -> Result<(), BenchError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), std::io::Error>>();
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let streams = (|| {
                    Ok::<_, std::io::Error>((
                        signal(SignalKind::interrupt())?,
                        signal(SignalKind::terminate())?,
                        signal(SignalKind::hangup())?,
                    ))
                })();
                let (mut int, mut term, mut hup) = match streams {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                }
            });
            INTERRUPTED.store(true, Ordering::SeqCst);
            eprintln!("\nsluice-bench: interrupted, stopping child processes");
            cleanup_all();
            std::process::exit(130);
        })
        .map_err(|e| BenchError::Spawn {
            what: "signal thread".into(),
            source: e,
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BenchError::Spawn {
            what: "signal handlers".into(),
            source: e,
        }),
        Err(_) => Err(BenchError::Spawn {
            what: "signal thread".into(),
            source: std::io::Error::other("signal thread exited early"),
        }),
    }
}

/// Stops every registered process group and removes every registered dir.
pub fn cleanup_all() {
    let mut groups = Vec::new();
    let mut dirs = Vec::new();
    with_registry(|r| {
        groups = std::mem::take(&mut r.groups);
        dirs = std::mem::take(&mut r.dirs);
    });
    // Stop in reverse start order: load generator, then proxy, then upstream.
    for pgid in groups.into_iter().rev() {
        stop_group(pgid, Duration::from_secs(3), || {});
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A private directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/sluice-bench-<pid>-<n>-<label>`.
    pub fn new(label: &str) -> Result<Self, BenchError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("sluice-bench-{}-{n}-{label}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| BenchError::io("create dir", &path, e))?;
        with_registry(|r| r.dirs.push(path.clone()));
        Ok(Self { path })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        with_registry(|r| r.dirs.retain(|d| d != &self.path));
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running child process (and its process group) that is stopped on drop.
#[derive(Debug)]
pub struct ProcessGuard {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl ProcessGuard {
    /// Starts `cmd` in a new process group with stdout and stderr appended to
    /// `log`. `name` is used in messages ("proxy nginx").
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self, BenchError> {
        let out = File::create(log).map_err(|e| BenchError::io("create", log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| BenchError::io("clone handle of", log, e))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // Hold the registry lock across spawn so a signal cannot see the
        // child running but unregistered.
        let mut result = None;
        with_registry(|r| {
            let spawned = cmd.spawn();
            if let Ok(child) = &spawned {
                r.groups.push(child.id());
            }
            result = Some(spawned);
        });
        let child = result
            .ok_or_else(|| BenchError::Spawn {
                what: name.into(),
                source: std::io::Error::other("registry unavailable"),
            })?
            .map_err(|e| BenchError::Spawn {
                what: name.into(),
                source: e,
            })?;
        Ok(Self {
            name: name.into(),
            child,
            log: log.to_owned(),
            exited: None,
        })
    }

    /// The child's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the exit status if the child has exited, without blocking.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits for the child to exit on its own, for at most `timeout`;
    /// returns `None` on timeout (the child keeps running).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit_status() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole combined stdout+stderr log written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Sends SIGINT to the process group (a program that finishes its work on Ctrl-C, such
    /// as `perf record`); returns whether the signal was delivered.
    pub fn interrupt(&self) -> bool {
        signal_group(self.child.id(), "INT")
    }

    /// Stops the process group (TERM, then KILL after 3 s) and reaps the child.
    pub fn stop(&mut self) {
        let pgid = self.child.id();
        let child = &mut self.child;
        let exited = &mut self.exited;
        stop_group(pgid, Duration::from_secs(3), || {
            if exited.is_none() {
                *exited = child.try_wait().ok().flatten();
            }
        });
        if self.exited.is_none() {
            // Only reached if TERM and KILL both failed to end it in time.
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
        with_registry(|r| r.groups.retain(|&g| g != pgid));
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Looks `program` up on `PATH` (like `command -v`).
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        // A zombie still has a /proc entry; treat state Z as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
            .unwrap_or(false)
    }

    fn grandchild_pid(root: u32) -> u32 {
        for _ in 0..200 {
            let all = procfs::all_processes();
            let members = procfs::tree_members(root, &all);
            if let Some(&p) = members.iter().find(|&&p| p != root) {
                return p;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no child of {root} appeared");
    }

    #[test]
    fn drop_stops_the_whole_group_and_counts_child_cpu() {
        let dir = TempDir::new("test").unwrap();
        let dir_path = dir.path().to_owned();
        let mut cmd = Command::new("sh");
        // The busy loop runs in a forked child, like an nginx worker.
        cmd.arg("-c").arg("(while :; do :; done) & wait");
        let guard = ProcessGuard::spawn("busy", cmd, &dir.path().join("busy.log")).unwrap();
        let root = guard.pid();
        let child = grandchild_pid(root);
        std::thread::sleep(Duration::from_millis(300));
        assert!(procfs::tree_cpu_ticks(root) > 0, "child CPU not counted");
        drop(guard);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!alive(root), "leader survived drop");
        assert!(!alive(child), "forked child survived drop");
        drop(dir);
        assert!(!dir_path.exists(), "temp dir not removed");
    }

    #[test]
    fn log_tail_returns_last_lines() {
        let dir = TempDir::new("test").unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo one; echo two; echo three >&2");
        let mut guard = ProcessGuard::spawn("echo", cmd, &dir.path().join("echo.log")).unwrap();
        let status = guard.wait_timeout(Duration::from_secs(5)).unwrap();
        assert!(status.success());
        assert_eq!(guard.log_tail(2), "two\nthree");
    }

    #[test]
    fn finds_sh_on_path() {
        assert!(find_on_path("sh").is_some());
        assert!(find_on_path("definitely-not-a-program-xyz").is_none());
    }
}
