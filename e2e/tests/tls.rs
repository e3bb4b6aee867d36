//! TLS through the whole pipeline: a kubernetes.io/tls Secret and an ApisixTls applied to a
//! real kube-apiserver reach the dataplane process, which serves the certificate for its
//! SNI; a renewed Secret (as cert-manager writes it) is served to the next handshake with
//! no restart; a broken Secret shows up in the ApisixTls status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_e2e::{Pipeline, eventually};

const HOST: &str = "secure.e2e";

/// A self-signed ECDSA certificate for [`HOST`] made with `openssl req`; (cert, key) PEM.
fn make_cert(dir: &Path, name: &str) -> (PathBuf, String, String) {
    let crt = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:P-256", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .args(["-subj", &format!("/CN={HOST}/O={name}")])
        .args(["-addext", &format!("subjectAltName=DNS:{HOST}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pem = std::fs::read_to_string(&crt).unwrap();
    let key = std::fs::read_to_string(&key).unwrap();
    (crt, pem, key)
}

fn indent(text: &str) -> String {
    text.trim().lines().map(|l| format!("    {l}\n")).collect()
}

fn secret_yaml(ns: &str, crt: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: secure-cert, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(crt),
        indent(key)
    )
}

/// `curl https://secure.e2e/hello` through the dataplane, trusting only `ca`; the HTTP
/// status, or `None` when the handshake fails verification against `ca`.
fn curl(p: &Pipeline, ca: &Path) -> Option<u16> {
    let port = p.https.port();
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg("--cacert")
        .arg(ca)
        .arg("--resolve")
        .arg(format!("{HOST}:{port}:127.0.0.1"))
        .arg(format!("https://{HOST}:{port}/hello"))
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn accepted(p: &Pipeline) -> Option<(String, String)> {
    let out = p
        .cluster
        .kubectl(&["get", "atls", "secure", "-n", &p.namespace, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    let c = obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["message"].as_str().unwrap_or("").to_owned(),
    ))
}

#[test]
fn apisixtls_serves_and_rotates_with_the_secret() {
    let p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();
    let dir = p.cluster.dir().join("certs");
    std::fs::create_dir_all(&dir).unwrap();
    let (v1_file, v1_crt, v1_key) = make_cert(&dir, "v1");
    let (v2_file, v2_crt, v2_key) = make_cert(&dir, "v2");

    p.cluster
        .apply(&p.route_yaml("demo", "/hello*").replace("demo.e2e", HOST))
        .unwrap();
    p.cluster
        .apply(&secret_yaml(&ns, &v1_crt, &v1_key))
        .unwrap();
    p.cluster
        .apply(&format!(
            "apiVersion: apisix.apache.org/v2\nkind: ApisixTls\nmetadata: {{name: secure, namespace: {ns}}}\nspec:\n  ingressClassName: apisix\n  hosts: [{HOST}]\n  secret: {{name: secure-cert, namespace: {ns}}}\n"
        ))
        .unwrap();

    // Served over HTTPS with the first certificate (curl verifies it against v1 only).
    eventually(Duration::from_secs(30), || {
        curl(&p, &v1_file).filter(|s| *s == 200)
    })
    .expect("HTTPS 200 with the v1 certificate");
    eventually(Duration::from_secs(20), || {
        accepted(&p).filter(|(s, _)| s == "True")
    })
    .expect("ApisixTls Accepted=True");

    // cert-manager renews: the Secret changes, the next handshake gets the new certificate.
    p.cluster
        .apply(&secret_yaml(&ns, &v2_crt, &v2_key))
        .unwrap();
    eventually(Duration::from_secs(30), || {
        curl(&p, &v2_file).filter(|s| *s == 200)
    })
    .expect("HTTPS 200 with the renewed (v2) certificate");
    assert_eq!(
        curl(&p, &v1_file),
        None,
        "the old certificate is no longer served"
    );

    // A broken renewal (key of another certificate) is reported on the ApisixTls, naming
    // the Secret; the object then serves nothing (handshakes for its host are refused).
    p.cluster
        .apply(&secret_yaml(&ns, &v2_crt, &v1_key))
        .unwrap();
    let (_, message) = eventually(Duration::from_secs(30), || {
        accepted(&p).filter(|(s, _)| s == "False")
    })
    .expect("ApisixTls Accepted=False after a mismatched key");
    assert!(
        message.contains("secure-cert") && message.contains("does not match"),
        "{message}"
    );
    eventually(Duration::from_secs(30), || {
        curl(&p, &v2_file).is_none().then_some(())
    })
    .expect("the broken certificate is not served");
}
