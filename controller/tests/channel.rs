//! The snapshot channel end to end in one process: the controller's gRPC server and real
//! dataplane clients applying snapshots to real stores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use sluice_controller::tls::{self, TlsFiles};
use sluice_dataplane::config::controller_client::{self, ClientTls};
use sluice_dataplane::config::store::Store;

#[tokio::test]
async fn dataplane_gets_current_snapshot_on_connect_and_every_change() {
    let ctl = Controller::start(None).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let dp = dataplane(client_config(ctl.url("http"), "dp-a", None, None));

    assert!(
        eventually(WAIT, || dp.store.state().version == 1).await,
        "timed out waiting for: dataplane serves v1"
    );
    assert!(
        eventually(WAIT, || {
            ctl.hub
                .dataplanes()
                .first()
                .is_some_and(|d| d.acked.as_ref().is_some_and(|a| a.version == 1))
        })
        .await,
        "timed out waiting for: controller saw the ACK of v1"
    );
    let info = ctl.hub.dataplanes();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].id, "dp-a");
    assert_eq!(
        info[0].acked.as_ref().unwrap().hash,
        dp.store.state().hash,
        "the ACK names the hash being served"
    );

    ctl.publish(2, snapshot("/b", "default/svc:80"));
    assert!(
        eventually(WAIT, || dp.store.state().version == 2).await,
        "timed out waiting for: dataplane serves v2"
    );
    assert!(
        eventually(WAIT, || ctl.metrics.acks.get() == 2).await,
        "timed out waiting for: two ACKs counted"
    );
    assert_eq!(ctl.metrics.connected_dataplanes.get(), 1);
    assert_eq!(ctl.metrics.nacks.get(), 0);
}

#[tokio::test]
async fn dataplane_connected_before_the_first_snapshot_gets_it_when_published() {
    let ctl = Controller::start(None).await;
    let dp = dataplane(client_config(ctl.url("http"), "early", None, None));
    assert!(
        eventually(WAIT, || ctl.hub.dataplanes().len() == 1).await,
        "timed out waiting for: dataplane connected"
    );
    assert!(
        !dp.store.ready(),
        "nothing to serve before the first snapshot"
    );

    ctl.publish(1, snapshot("/a", "default/svc:80"));
    assert!(
        eventually(WAIT, || dp.store.state().version == 1).await,
        "timed out waiting for: dataplane serves v1"
    );
    assert!(dp.store.ready());
}

#[tokio::test]
async fn a_snapshot_the_dataplane_cannot_compile_is_nacked_and_the_last_good_one_serves() {
    let ctl = Controller::start(None).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let dp = dataplane(client_config(ctl.url("http"), "dp-a", None, None));
    assert!(
        eventually(WAIT, || dp.store.state().version == 1).await,
        "timed out waiting for: dataplane serves v1"
    );

    // A route pointing at an upstream the snapshot does not carry.
    ctl.publish(2, snapshot("/b", "default/missing:80"));
    assert!(
        eventually(WAIT, || {
            ctl.hub
                .dataplanes()
                .first()
                .is_some_and(|d| d.nacked.is_some())
        })
        .await,
        "timed out waiting for: controller saw the NACK of v2"
    );
    let info = &ctl.hub.dataplanes()[0];
    let (nacked, reasons) = info.nacked.clone().unwrap();
    assert_eq!(nacked.version, 2);
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown upstream `default/missing:80`")),
        "{reasons:?}"
    );
    assert_eq!(info.acked.as_ref().unwrap().version, 1);
    assert_eq!(ctl.metrics.nacks.get(), 1);
    let state = dp.store.state();
    assert_eq!(state.version, 1, "the last good snapshot keeps serving");
    assert!(
        state
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("v2 rejected"),
        "{state:?}"
    );

    // A fixed snapshot is ACKed and clears the NACK.
    ctl.publish(3, snapshot("/c", "default/svc:80"));
    assert!(
        eventually(WAIT, || dp.store.state().version == 3).await,
        "timed out waiting for: dataplane serves v3"
    );
    assert!(
        eventually(WAIT, || {
            ctl.hub.dataplanes().first().is_some_and(|d| {
                d.nacked.is_none() && d.acked.as_ref().is_some_and(|a| a.version == 3)
            })
        })
        .await,
        "timed out waiting for: NACK cleared by the ACK of v3"
    );
}

#[tokio::test]
async fn dataplane_reconnects_after_the_controller_restarts() {
    let ctl = Controller::start(None).await;
    let addr = ctl.addr;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let dp = dataplane(client_config(ctl.url("http"), "dp-a", None, None));
    assert!(
        eventually(WAIT, || dp.store.state().version == 1).await,
        "timed out waiting for: dataplane serves v1"
    );
    let served_hash = dp.store.state().hash;

    ctl.stop().await;
    // Still serving while the controller is away.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(dp.store.state().version, 1);

    // A restarted controller starts its versions over; the dataplane takes them anyway.
    let ctl = Controller::start_on(addr, None).await;
    assert!(
        eventually(WAIT, || ctl.hub.dataplanes().len() == 1).await,
        "timed out waiting for: dataplane redialed"
    );
    assert!(
        eventually(WAIT, || {
            ctl.hub.dataplanes()[0].serving_at_connect.is_some()
        })
        .await,
        "timed out waiting for: hello reports what the dataplane serves"
    );
    let hello = ctl.hub.dataplanes()[0].serving_at_connect.clone().unwrap();
    assert_eq!((hello.version, hello.hash), (1, served_hash));

    ctl.publish(1, snapshot("/new", "default/svc:80"));
    assert!(
        eventually(WAIT, || {
            dp.store.state().hash == ctl.hub.current().unwrap().snapshot.hash
        })
        .await,
        "timed out waiting for: dataplane serves the new controller's snapshot"
    );
}

#[tokio::test]
async fn disconnected_dataplanes_are_forgotten() {
    let ctl = Controller::start(None).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let a = dataplane(client_config(ctl.url("http"), "a", None, None));
    let b = dataplane(client_config(ctl.url("http"), "b", None, None));
    assert!(
        eventually(WAIT, || ctl.metrics.acks.get() == 2).await,
        "timed out waiting for: both ACKed"
    );
    assert_eq!(ctl.metrics.connected_dataplanes.get(), 2);
    drop(a);
    assert!(
        eventually(WAIT, || ctl.hub.dataplanes().len() == 1).await,
        "timed out waiting for: one dataplane left"
    );
    assert_eq!(ctl.hub.dataplanes()[0].id, "b");
    assert_eq!(ctl.metrics.connected_dataplanes.get(), 1);
    drop(b);
}

#[tokio::test]
async fn restarted_dataplane_serves_the_persisted_snapshot_without_a_controller() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(None).await;
    ctl.publish(4, snapshot("/a", "default/svc:80"));
    let dp = dataplane(client_config(
        ctl.url("http"),
        "dp-a",
        None,
        Some(dir.path().to_path_buf()),
    ));
    assert!(
        eventually(WAIT, || dp.store.state().version == 4).await,
        "timed out waiting for: dataplane serves v4"
    );
    // A rejected snapshot must not replace the persisted one.
    ctl.publish(5, snapshot("/b", "default/missing:80"));
    assert!(
        eventually(WAIT, || ctl.metrics.nacks.get() == 1).await,
        "timed out waiting for: NACK of v5"
    );
    let hash = dp.store.state().hash;
    drop(dp);
    ctl.stop().await;

    // "Restart": a fresh store, no controller reachable.
    let store = Arc::new(Store::new().unwrap());
    assert_eq!(
        controller_client::restore(&store, dir.path()).unwrap(),
        Some(4)
    );
    let state = store.state();
    assert_eq!(
        (state.version, state.hash.clone(), state.routes),
        (4, hash, 1)
    );
    assert!(store.ready());

    // The client keeps redialing a dead address; the restored table keeps serving.
    let dead = "http://127.0.0.1:1".to_string();
    let dp = dataplane_with_store(client_config(dead, "dp-a", None, None), Arc::clone(&store));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(dp.store.state().version, 4);
}

fn write_pki(dir: &std::path::Path, pki: &Pki) -> TlsFiles {
    std::fs::write(dir.join("ca.pem"), &pki.ca).unwrap();
    std::fs::write(dir.join("tls.crt"), &pki.server_cert).unwrap();
    std::fs::write(dir.join("tls.key"), &pki.server_key).unwrap();
    TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca: dir.join("ca.pem"),
    }
}

#[tokio::test]
async fn mutual_tls_admits_dataplanes_with_a_certificate_from_the_ca_only() {
    tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki();
    let files = write_pki(dir.path(), &pki);
    let server_tls = tls::channel_security("127.0.0.1:0".parse().unwrap(), Some(&files), false)
        .unwrap()
        .unwrap();
    let ctl = Controller::start(Some(server_tls)).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let url = format!("https://localhost:{}", ctl.addr.port());

    let good = ClientTls {
        ca: pki.ca.clone().into_bytes(),
        cert: pki.client_cert.clone().into_bytes(),
        key: pki.client_key.clone().into_bytes(),
        server_name: None,
        files: None,
    };
    let dp = dataplane(client_config(
        url.clone(),
        "tls-dp",
        Some(good.clone()),
        None,
    ));
    assert!(
        eventually(WAIT, || { dp.store.state().version == 1 }).await,
        "timed out waiting for: dataplane serves v1 over mTLS"
    );
    assert!(
        eventually(WAIT, || ctl.metrics.acks.get() == 1).await,
        "timed out waiting for: ACK over mTLS"
    );

    // A client certificate from another CA is refused by the controller.
    let other = make_pki();
    let stranger = ClientTls {
        ca: pki.ca.clone().into_bytes(),
        cert: other.client_cert.into_bytes(),
        key: other.client_key.into_bytes(),
        server_name: None,
        files: None,
    };
    let store = Arc::new(Store::new().unwrap());
    let (received, err) = controller_client::run_once(
        &client_config(url.clone(), "stranger", Some(stranger), None),
        &store,
        || {},
    )
    .await;
    assert!(
        !received,
        "no snapshot for a client the CA did not sign: {err}"
    );
    assert!(!store.ready());

    // No client certificate at all is refused too.
    let anonymous = ClientTls {
        ca: pki.ca.clone().into_bytes(),
        cert: Vec::new(),
        key: Vec::new(),
        server_name: None,
        files: None,
    };
    let (received, _) = controller_client::run_once(
        &client_config(url.clone(), "anon", Some(anonymous), None),
        &store,
        || {},
    )
    .await;
    assert!(!received);

    // A controller certificate the dataplane's CA did not sign is refused by the dataplane.
    let wrong_ca = ClientTls {
        ca: other.ca.into_bytes(),
        ..good
    };
    let (received, _) = controller_client::run_once(
        &client_config(url, "wrong-ca", Some(wrong_ca), None),
        &store,
        || {},
    )
    .await;
    assert!(!received);
    assert!(!store.ready());
    assert_eq!(ctl.metrics.acks.get(), 1, "only the good dataplane ACKed");
}

#[tokio::test]
async fn plaintext_client_cannot_talk_to_a_tls_controller() {
    tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki();
    let files = write_pki(dir.path(), &pki);
    let server_tls = files.server_config().unwrap();
    let ctl = Controller::start(Some(server_tls)).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));
    let store = Arc::new(Store::new().unwrap());
    let (received, _) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        controller_client::run_once(
            &client_config(ctl.url("http"), "plain", None, None),
            &store,
            || {},
        ),
    )
    .await
    .unwrap();
    assert!(!received);
    assert!(!store.ready());
}

#[tokio::test]
async fn dataplane_reads_rotated_certificates_before_redialing() {
    tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki();
    let files = write_pki(dir.path(), &pki);
    let ctl = Controller::start(Some(files.server_config().unwrap())).await;
    ctl.publish(1, snapshot("/a", "default/svc:80"));

    // The dataplane starts with a certificate the controller's CA did not sign ...
    let other = make_pki();
    let (ca, cert, key) = (
        dir.path().join("dp-ca.pem"),
        dir.path().join("dp.crt"),
        dir.path().join("dp.key"),
    );
    std::fs::write(&ca, &pki.ca).unwrap();
    std::fs::write(&cert, &other.client_cert).unwrap();
    std::fs::write(&key, &other.client_key).unwrap();
    let client_tls = ClientTls::from_files(&ca, &cert, &key, None).unwrap();
    let url = format!("https://localhost:{}", ctl.addr.port());
    let dp = dataplane(client_config(url, "rotating", Some(client_tls), None));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!dp.store.ready(), "refused with the wrong certificate");

    // ... then the certificate files are rotated in place: the next dial uses them.
    std::fs::write(&cert, &pki.client_cert).unwrap();
    std::fs::write(&key, &pki.client_key).unwrap();
    assert!(
        eventually(WAIT, || { dp.store.state().version == 1 }).await,
        "timed out waiting for: dataplane connects with the rotated certificate"
    );
}
