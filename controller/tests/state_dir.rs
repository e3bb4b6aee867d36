//! Faults around the dataplane's state directory, on real `sluice-dataplane` processes fed
//! by the controller's gRPC server: a process SIGKILLed while it writes its snapshot never
//! leaves a half-written one, and a state directory that cannot be written (not a
//! directory, or a full disk) is logged while serving goes on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sluice_dataplane::config::controller_client;
use sluice_dataplane::config::store::Store;
use sluice_proto::v1;

/// A `sluice-dataplane` process in controller mode; SIGKILLed when dropped.
struct Process {
    child: Child,
    http: SocketAddr,
    log: std::path::PathBuf,
}

impl Process {
    fn start(controller: &str, state_dir: &Path, log: &Path) -> Process {
        let bin = sluice_e2e::workspace_bin("sluice-dataplane", "sluice-dataplane").unwrap();
        let http = sluice_e2e::free_port().unwrap();
        let https = sluice_e2e::free_port().unwrap();
        let admin = sluice_e2e::free_port().unwrap();
        let child = Command::new(bin)
            .args(["--controller", controller, "--insecure", "--workers", "1"])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--listen-http", &http.to_string()])
            .args(["--listen-https", &https.to_string()])
            .args(["--admin", &admin.to_string()])
            .args(["--dataplane-id", "dp-kill"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Process {
            child,
            http,
            log: log.to_owned(),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The status of `GET /v<version>`: a route of that snapshot answers 502 (its upstream
    /// is a closed port), no route 404.
    fn status_of(&self, version: u64) -> Option<u16> {
        sluice_e2e::http_get(self.http, "h", &format!("/v{version}"))
            .ok()
            .map(|r| r.status)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A snapshot whose route `/v<version>` marks its version, padded with `extra` routes of
/// long paths so that writing it takes a while (about 330 bytes a route).
fn versioned(version: u64, extra: usize) -> v1::Snapshot {
    let mut s = snapshot(&format!("/v{version}"), "default/svc:80");
    let pad = "p".repeat(300);
    for i in 0..extra {
        let mut r = s.routes[0].clone();
        r.id = format!("default/pad/r{i}");
        r.paths = vec![format!("/pad/{i}/{pad}")];
        s.routes.push(r);
    }
    s
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataplane_killed_while_persisting_never_leaves_a_half_written_snapshot() {
    const EXTRA: usize = 3_000; // about 1 MB a snapshot
    const KILLS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ctl = Controller::start(None).await;
    let url = ctl.url("http");
    let mut version = 1;
    ctl.publish(version, versioned(version, EXTRA));
    let mut in_write = 0;
    for kill in 0..KILLS {
        let mut dp = Process::start(&url, &state, &dir.path().join(format!("dp-{kill}.log")));
        // A new snapshot every 20 ms while the process starts, applies and persists them.
        let started = Instant::now();
        let acked_before_kill = loop {
            version += 1;
            ctl.publish(version, versioned(version, EXTRA));
            tokio::time::sleep(Duration::from_millis(20)).await;
            let acked = ctl
                .hub
                .dataplanes()
                .iter()
                .filter_map(|d| d.acked.as_ref().map(|a| a.version))
                .max();
            // Every other round: kill the moment a write is under way (its temporary file
            // exists); the others at a moment that depends on the round.
            let writing = state.join(".snapshot.pb.tmp").exists();
            let due = if kill % 2 == 0 {
                writing && acked.is_some()
            } else {
                acked.is_some() && started.elapsed() > Duration::from_millis(40 * (kill % 7))
            };
            if due {
                in_write += u32::from(writing);
                break acked.unwrap_or(0);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the dataplane never acknowledged a snapshot: {}",
                dp.log()
            );
        };
        dp.kill();
        // What a restarted process would load: whole, hash-checked, and not older than
        // what it acknowledged (it persists before it acknowledges).
        let store = Store::new().unwrap();
        let restored = controller_client::restore(&store, &state)
            .unwrap_or_else(|e| panic!("round {kill}: the persisted snapshot is broken: {e}"));
        let restored = restored.expect("a snapshot was persisted");
        assert!(
            restored >= acked_before_kill && restored <= version,
            "round {kill}: restored v{restored}, acknowledged v{acked_before_kill}, last sent v{version}"
        );
    }
    assert!(in_write > 0, "no kill landed while a write was under way");

    // And the real thing: a restarted process with no controller serves the persisted
    // snapshot.
    let store = Store::new().unwrap();
    let persisted = controller_client::restore(&store, &state).unwrap().unwrap();
    ctl.stop().await;
    let dp = Process::start("http://127.0.0.1:1", &state, &dir.path().join("last.log"));
    let served = blocking(move || {
        sluice_e2e::eventually(Duration::from_secs(20), || {
            (dp.status_of(persisted) == Some(502)).then_some(())
        })
        .is_some()
    })
    .await;
    assert!(
        served,
        "the restarted dataplane does not serve v{persisted}"
    );
}

/// Publishes versions `from..=to` one by one and checks that the dataplane serves each.
async fn serves_each(ctl: &Controller, dp: &Arc<Process>, from: u64, to: u64) {
    for version in from..=to {
        ctl.publish(version, versioned(version, 0));
        let probe = Arc::clone(dp);
        let served = blocking(move || {
            sluice_e2e::eventually(Duration::from_secs(20), || {
                (probe.status_of(version) == Some(502)).then_some(())
            })
            .is_some()
        })
        .await;
        assert!(served, "v{version} is not served: {}", dp.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_that_cannot_be_written_is_logged_and_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(None).await;
    let url = ctl.url("http");

    // Not a directory (a file sits where the state directory should be created).
    let file = dir.path().join("file");
    std::fs::write(&file, "not a directory").unwrap();
    let dp = Arc::new(Process::start(
        &url,
        &file.join("state"),
        &dir.path().join("notdir.log"),
    ));
    serves_each(&ctl, &dp, 1, 3).await;
    assert!(
        dp.log().contains("cannot persist the snapshot"),
        "no warning: {}",
        dp.log()
    );
    drop(dp);

    // A full disk: the temporary file is a link to /dev/full, whose writes fail with ENOSPC.
    // A snapshot persisted earlier stays as it was.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let earlier = {
        let earlier = Store::new().unwrap();
        let dp = dataplane_with_store(
            client_config(url.clone(), "dp-first", None, Some(full.clone())),
            Arc::new(earlier),
        );
        ctl.publish(4, versioned(4, 0));
        assert!(
            eventually(WAIT, || {
                let probe = Store::new().unwrap();
                matches!(controller_client::restore(&probe, &full), Ok(Some(4)))
            })
            .await,
            "timed out waiting for: v4 persisted"
        );
        drop(dp);
        let _ = std::fs::remove_file(full.join(".snapshot.pb.tmp"));
        std::fs::read(full.join("snapshot.pb")).unwrap()
    };
    std::os::unix::fs::symlink("/dev/full", full.join(".snapshot.pb.tmp")).unwrap();
    let dp = Arc::new(Process::start(&url, &full, &dir.path().join("full.log")));
    serves_each(&ctl, &dp, 5, 7).await;
    let log = dp.log();
    assert!(
        log.contains("cannot persist the snapshot") && log.contains("No space left on device"),
        "no warning naming the cause: {log}"
    );
    assert_eq!(
        std::fs::read(full.join("snapshot.pb")).unwrap(),
        earlier,
        "the snapshot persisted earlier was changed"
    );
    assert!(
        dp.status_of(7) == Some(502),
        "the process stopped serving after the failed writes"
    );
}
