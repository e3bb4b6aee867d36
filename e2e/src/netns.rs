//! Network namespaces for test backends.
//!
//! The API server rejects loopback addresses in EndpointSlices, so a backend that a Service
//! points at must listen on a routable address. Each [`Netns`] is a network namespace joined
//! to the root namespace by a veth pair whose addresses come from one `/28` of
//! [`SUBNET_POOL`]: `.1` on the root side, `.2` (and up to `.14` via [`Netns::add_address`])
//! inside. Nothing leaves the machine: the addresses exist only on that pair.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::Error;
use crate::process::{command, describe, run_ok};

/// The private range test namespaces take their `/28`s from.
pub const SUBNET_POOL: &str = "10.251.0.0/16";
const POOL_BASE: [u8; 2] = [10, 251];
const SUBNETS: u32 = 4096;
/// Prefix of every namespace this module creates: `sluice-e2e-<pid>-<n>`.
const NAME_PREFIX: &str = "sluice-e2e-";
const LOCK_FILE: &str = "/tmp/sluice-e2e-netns.lock";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A network namespace with a veth pair to the root namespace; deleted on drop, together with
/// any process still running inside it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    host_if: String,
    ns_if: String,
    subnet: u32,
    addrs: Vec<Ipv4Addr>,
}

/// A process running inside a [`Netns`]; killed on drop.
#[derive(Debug)]
pub struct Backend {
    child: Child,
    addr: SocketAddr,
    command: String,
}

fn ip(args: &[&str]) -> Result<String, Error> {
    run_ok(&mut command("ip", args))
}

fn subnet_addr(subnet: u32, host: u8) -> Ipv4Addr {
    // 16 addresses per subnet: subnet index i covers POOL.(i/16).((i%16)*16)/28.
    let third = (subnet / 16) as u8;
    let fourth = ((subnet % 16) * 16) as u8 + host;
    Ipv4Addr::new(POOL_BASE[0], POOL_BASE[1], third, fourth)
}

fn subnet_of(addr: Ipv4Addr) -> Option<u32> {
    let o = addr.octets();
    (o[0] == POOL_BASE[0] && o[1] == POOL_BASE[1])
        .then(|| u32::from(o[2]) * 16 + u32::from(o[3]) / 16)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn pid_alive(pid: &str) -> bool {
    Path::new("/proc").join(pid).exists()
}

/// Deletes namespaces left behind by test processes that no longer exist.
fn sweep_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('-') else {
            continue;
        };
        if !pid_alive(pid) {
            kill_all_in(name);
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

fn kill_all_in(name: &str) {
    if let Ok(pids) = ip(&["netns", "pids", name]) {
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill")
                .args(["-KILL", pid])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Netns {
    /// Creates a namespace, panicking with the reason if it cannot. See [`Netns::try_create`].
    pub fn create() -> Netns {
        match Netns::try_create() {
            Ok(n) => n,
            Err(e) => panic!("{e}"),
        }
    }

    /// Creates a network namespace `sluice-e2e-<pid>-<n>` with loopback up, a veth pair to the
    /// root namespace, `.1/28` on the root side and `.2/28` inside (see [`Netns::addr`]), and a
    /// default route back through the root side. Needs root.
    pub fn try_create() -> Result<Netns, Error> {
        if !is_root() {
            return Err(Error::NotRoot);
        }
        let pid = std::process::id();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NAME_PREFIX}{pid}-{n}");
        // Interface names are limited to 15 bytes: "se" + pid (hex, <= 6) + h/n + n.
        let host_if = format!("se{pid:x}h{n}");
        let ns_if = format!("se{pid:x}n{n}");

        // NB: the lock serializes subnet choice across concurrent test processes; it is
        // released when `lock` drops, after the addresses are in place.
        let lock =
            File::create(LOCK_FILE).map_err(|e| Error::io(format!("opening {LOCK_FILE}"), e))?;
        lock.lock()
            .map_err(|e| Error::io(format!("locking {LOCK_FILE}"), e))?;
        sweep_stale();
        let used: std::collections::BTreeSet<u32> = ip(&["-4", "-o", "addr", "show"])?
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                words.position(|w| w == "inet")?;
                let cidr = words.next()?;
                let addr = cidr.split('/').next()?.parse::<Ipv4Addr>().ok()?;
                subnet_of(addr)
            })
            .collect();
        let subnet = (0..SUBNETS)
            .find(|s| !used.contains(s))
            .ok_or(Error::NoSubnet(SUBNET_POOL))?;

        ip(&["netns", "add", &name])?;
        let mut netns = Netns {
            name,
            host_if,
            ns_if,
            subnet,
            addrs: Vec::new(),
        };
        // From here on, Drop cleans up whatever part was created.
        netns.setup()?;
        drop(lock);
        Ok(netns)
    }

    fn setup(&mut self) -> Result<(), Error> {
        let name = self.name.clone();
        let host = format!("{}/28", subnet_addr(self.subnet, 1));
        let inner = subnet_addr(self.subnet, 2);
        ip(&[
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &self.ns_if,
            "netns",
            &name,
        ])?;
        ip(&["addr", "add", &host, "dev", &self.host_if])?;
        ip(&["link", "set", &self.host_if, "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{inner}/28"),
            "dev",
            &self.ns_if,
        ])?;
        ip(&["-n", &name, "link", "set", &self.ns_if, "up"])?;
        ip(&[
            "-n",
            &name,
            "route",
            "add",
            "default",
            "via",
            &subnet_addr(self.subnet, 1).to_string(),
        ])?;
        self.addrs.push(inner);
        Ok(())
    }

    /// The namespace's name (for `ip netns exec NAME ...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first address inside the namespace (`.2` of its `/28`): where backends listen and
    /// what EndpointSlices point at.
    pub fn addr(&self) -> Ipv4Addr {
        self.addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// Every address inside the namespace, in the order they were added.
    pub fn addrs(&self) -> &[Ipv4Addr] {
        &self.addrs
    }

    /// The root-namespace end of the veth pair (`.1`): the source address of connections
    /// from the root namespace.
    pub fn host_addr(&self) -> Ipv4Addr {
        subnet_addr(self.subnet, 1)
    }

    /// The subnet of the pair, e.g. `10.251.0.16/28`.
    pub fn subnet(&self) -> String {
        format!("{}/28", subnet_addr(self.subnet, 0))
    }

    /// Adds another address inside the namespace (`.3` up to `.14`), e.g. for a Service with
    /// several endpoints on the same port.
    pub fn add_address(&mut self) -> Result<Ipv4Addr, Error> {
        let next = self.addrs.len() + 2;
        if next > 14 {
            return Err(Error::NoAddress(self.name.clone()));
        }
        let addr = subnet_addr(self.subnet, next as u8);
        ip(&[
            "-n",
            &self.name,
            "addr",
            "add",
            &format!("{addr}/28"),
            "dev",
            &self.ns_if,
        ])?;
        self.addrs.push(addr);
        Ok(addr)
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Spawns `cmd` (from [`Netns::command`]) and waits until `addr` accepts TCP connections
    /// from the root namespace, for at most `timeout`. See [`Backend::spawn`].
    pub fn spawn(
        &self,
        cmd: Command,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Backend, Error> {
        Backend::spawn(cmd, addr, timeout)
    }

    /// Runs the workspace's `sluice-echo` backend named `name` inside the namespace on
    /// `addr:port` (an address of [`Netns::addrs`]) and waits until it answers. Builds
    /// `sluice-echo` first if needed (see [`crate::workspace_bin`]).
    pub fn spawn_echo(&self, name: &str, addr: Ipv4Addr, port: u16) -> Result<Backend, Error> {
        let bin = crate::workspace_bin("sluice-testkit", "sluice-echo")?;
        let listen = SocketAddr::from((addr, port));
        let mut cmd = self.command(bin);
        cmd.args(["--listen", &listen.to_string(), "--name", name]);
        self.spawn(cmd, listen, Duration::from_secs(10))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        kill_all_in(&self.name);
        // Deleting the root end removes both ends of the pair.
        let _ = ip(&["link", "delete", &self.host_if]);
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("sluice-e2e: deleting network namespace {}: {e}", self.name);
        }
    }
}

impl Backend {
    /// Spawns `cmd` (in whatever namespace it starts itself, e.g. the root one for a
    /// dataplane, or via [`Netns::command`]) and waits until `addr` accepts TCP connections,
    /// for at most `timeout`. Its stdout is discarded, its stderr goes to the test's stderr.
    /// Fails early with its exit status if it dies first.
    pub fn spawn(mut cmd: Command, addr: SocketAddr, timeout: Duration) -> Result<Backend, Error> {
        let command = describe(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| Error::Spawn {
                command: command.clone(),
                source,
                hint: String::new(),
            })?;
        let mut backend = Backend {
            child,
            addr,
            command,
        };
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(backend);
            }
            let died = backend.child.try_wait().ok().flatten();
            if died.is_some() || Instant::now() >= deadline {
                let log = died
                    .map(|s| format!(" (it exited: {s})"))
                    .unwrap_or_default();
                return Err(Error::BackendNotReady {
                    command: backend.command.clone(),
                    addr,
                    timeout,
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (has not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills it now (drop does the same).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn subnets_tile_the_pool_without_overlap() {
        assert_eq!(subnet_addr(0, 1), Ipv4Addr::new(10, 251, 0, 1));
        assert_eq!(subnet_addr(1, 2), Ipv4Addr::new(10, 251, 0, 18));
        assert_eq!(subnet_addr(16, 14), Ipv4Addr::new(10, 251, 1, 14));
        assert_eq!(
            subnet_addr(SUBNETS - 1, 14),
            Ipv4Addr::new(10, 251, 255, 254)
        );
        for s in [0, 1, 15, 16, 17, 4095] {
            for host in 0..16 {
                assert_eq!(subnet_of(subnet_addr(s, host)), Some(s));
            }
        }
        assert_eq!(subnet_of(Ipv4Addr::new(10, 250, 0, 1)), None);
    }
}
