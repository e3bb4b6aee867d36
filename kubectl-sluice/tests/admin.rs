//! `diff --against URL` and `explain --admin URL` read a remote dataplane: its answer is
//! hostile input. Escape sequences never reach the terminal, an error body is cut, and a
//! server that trickles bytes cannot hold the CLI past `--request-timeout`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A server answering every connection with `answer` (after reading the request head),
/// then, when `trickle`, one more byte every 200 ms until the client goes away. Without
/// `trickle` it then shuts its side and reads to the end: closing with request bytes
/// unread would reset the connection, and the client could see the reset before the
/// answer (a flake CI saw: "Connection reset by peer").
fn serve(answer: Vec<u8>, trickle: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if conn.write_all(&answer).is_err() {
                    return;
                }
                if !trickle {
                    let _ = conn.shutdown(std::net::Shutdown::Write);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                    return;
                }
                loop {
                    std::thread::sleep(Duration::from_millis(200));
                    if conn.write_all(b"x").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Runs `kubectl-sluice diff -f <fixture> --against http://addr extra...`; a hang is a
/// failure after 120 s (the guard, not the behaviour under test).
fn diff_against(addr: SocketAddr, extra: &[&str]) -> Output {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/shop.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
        .args([
            "diff",
            "-f",
            fixture,
            "--against",
            &format!("http://{addr}"),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let guard = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > guard {
            child.kill().unwrap();
            panic!("kubectl-sluice diff still running after 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn assert_no_controls(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(
        !text
            .chars()
            .any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{202e}'),
        "{what} carries a control character: {text:?}"
    );
}

#[test]
fn an_error_body_is_cut_and_its_escape_sequences_shown_escaped() {
    let mut answer =
        b"HTTP/1.0 500 Oops\x1b[2J\r\n\r\n\x1b]0;pwned\x07\x1b[2J\rgone\xc2\x9b".to_vec();
    answer.extend(std::iter::repeat_n(b'x', 50_000));
    let addr = serve(answer, false);
    let out = diff_against(addr, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_no_controls("stderr", &out.stderr);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\\u{1b}]0;pwned\\u{7}"), "{err}");
    assert!(err.len() < 2_000, "the body is cut: {} bytes", err.len());
}

#[test]
fn a_served_snapshot_cannot_write_escape_sequences_to_the_terminal() {
    let doc = serde_json::json!({
        "version": 7,
        "hash": "h",
        "snapshot": {"routes": [{
            "id": "evil\u{1b}]0;owned\u{7}\u{1b}[31m\u{202e}route",
            "hosts": ["x\u{1b}[2J.example"],
        }]},
    });
    let mut answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n".to_vec();
    answer.extend(doc.to_string().as_bytes());
    let addr = serve(answer, false);
    let out = diff_against(addr, &[]);
    assert_eq!(out.status.code(), Some(1), "differences: {out:?}");
    assert_no_controls("stdout", &out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("evil\\u{1b}]0;owned\\u{7}"), "{text}");
}

#[test]
fn a_trickling_server_is_cut_at_the_request_timeout() {
    let addr = serve(b"HTTP/1.0 200 OK\r\n\r\n{".to_vec(), true);
    let out = diff_against(addr, &["--request-timeout", "2s"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no complete answer within 2s (--request-timeout)"),
        "{err}"
    );
}

#[test]
fn request_timeout_is_checked() {
    for bad in ["0s", "2h", "soon", "-1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
            .args(["diff", "-f", "x.yaml", "--against", "y.yaml"])
            .arg(format!("--request-timeout={bad}"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--request-timeout"), "{bad}: {err}");
    }
}
