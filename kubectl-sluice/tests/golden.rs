//! Golden tests: run the built `kubectl-sluice` on `tests/fixtures` (and the translate
//! crate's golden inputs, `lib/translate/testdata/<family>/<case>.in.yaml`) and compare stdout and the exit code with `tests/golden/<case>.txt`.
//! Regenerate after an intended change with
//! `SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-kubectl --test golden` and review the diff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

fn run(args: &[&str], stdin: Option<&str>) -> (String, i32) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl-sluice");
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

fn golden(case: &str, args: &[&str], stdin: Option<&str>) {
    let (stdout, code) = run(args, stdin);
    let got = format!(
        "$ kubectl-sluice {}\n{stdout}(exit {code})\n",
        args.join(" ")
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{case}.txt"));
    if std::env::var_os("SLUICE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (SLUICE_UPDATE_GOLDEN=1 creates it)",
            path.display()
        )
    });
    assert_eq!(got, want, "golden {case} differs");
}

#[test]
fn validate_reports_rejections_and_warnings() {
    golden(
        "validate-shop",
        &["validate", "-f", "tests/fixtures/shop.yaml"],
        None,
    );
}

#[test]
fn validate_clean_files_exit_0() {
    golden(
        "validate-basic",
        &[
            "validate",
            "-f",
            "../lib/translate/testdata/apisix/basic.in.yaml",
        ],
        None,
    );
}

#[test]
fn validate_reads_stdin_and_names_bad_documents() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lib/translate/testdata/load/load-errors.in.yaml"),
    )
    .unwrap();
    golden("validate-stdin", &["validate", "-f", "-"], Some(&text));
}

#[test]
fn validate_json_output() {
    golden(
        "validate-shop-json",
        &["validate", "-o", "json", "-f", "tests/fixtures/shop.yaml"],
        None,
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["validate"], None).1, 2);
    assert_eq!(
        run(&["validate", "-f", "tests/fixtures/nope.yaml"], None).1,
        2
    );
    assert_eq!(run(&["frobnicate"], None).1, 2);
    let bad_header = [
        "explain",
        "http://a/",
        "-H",
        "nocolon",
        "-f",
        "tests/fixtures/shop.yaml",
    ];
    assert_eq!(run(&bad_header, None).1, 2);
}

#[test]
fn explain_shows_route_candidates_plugins_and_upstream() {
    golden(
        "explain-get",
        &[
            "explain",
            "http://api.shop.example/v1/orders?id=7",
            "-f",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
}

#[test]
fn explain_post_yaml() {
    golden(
        "explain-post-yaml",
        &[
            "explain",
            "http://api.shop.example/v1/orders",
            "-X",
            "POST",
            "-H",
            "x-canary: 2",
            "-o",
            "yaml",
            "-f",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
}

#[test]
fn explain_canary_by_header() {
    golden(
        "explain-canary",
        &[
            "explain",
            "api.shop.example/v1/orders",
            "-H",
            "X-Canary: 1",
            "--client-ip",
            "10.1.2.3",
            "-f",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
}

#[test]
fn explain_no_route_is_404() {
    golden(
        "explain-404",
        &[
            "explain",
            "https://nothing.example/",
            "-f",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
}

#[test]
fn diff_lists_added_removed_changed() {
    golden(
        "diff-shop",
        &[
            "diff",
            "-f",
            "tests/fixtures/shop-v2.yaml",
            "--against",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
}

#[test]
fn diff_of_identical_files_is_empty_exit_0() {
    let (out, code) = run(
        &[
            "diff",
            "-f",
            "tests/fixtures/shop.yaml",
            "--against",
            "tests/fixtures/shop.yaml",
        ],
        None,
    );
    assert_eq!(code, 0);
    assert_eq!(out, "0 changes: 0 added, 0 removed, 0 changed\n");
}

#[test]
fn diff_never_prints_secret_material() {
    let tls = "../lib/translate/testdata/apisix/tls-apisixtls.in.yaml";
    for format in ["text", "json", "yaml"] {
        let (out, code) = run(
            &[
                "diff",
                "-o",
                format,
                "-f",
                tls,
                "--against",
                "tests/fixtures/shop.yaml",
            ],
            None,
        );
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("certificate"), "{out}");
        assert!(!out.contains("BEGIN"), "PEM in output: {out}");
    }
    // Changed key material is named, never shown.
    let (out, _) = run(
        &[
            "diff",
            "-f",
            tls,
            "--against",
            "../lib/translate/testdata/ingress/tls.in.yaml",
        ],
        None,
    );
    assert!(!out.contains("BEGIN"), "PEM in output: {out}");
}

/// The upstream request comes from running the route's proxy-rewrite plugin: regex_uri
/// applied, the method changed, a removed header named, a credential header's value
/// hidden; `pass_host: node` gives the endpoint as Host.
#[test]
fn explain_runs_proxy_rewrite_and_hides_credentials() {
    golden(
        "explain-rewrite",
        &[
            "explain",
            "http://old.shop.example/api/v0/orders/7?full=1",
            "-H",
            "X-Debug: 1",
            "-f",
            "tests/fixtures/rewrite.yaml",
        ],
        None,
    );
}

/// Shadowed routes as the router decides them (see the fixture's comment): `dup`,
/// `wild-low` and `post` are reported; `under`, `getonly`, `wild`, `wild-exact` and
/// `canary` are not.
#[test]
fn validate_finds_shadowed_routes_with_the_router() {
    golden(
        "validate-shadow",
        &["validate", "-f", "tests/fixtures/shadow.yaml"],
        None,
    );
}

/// Text output fits an 80-column terminal: every line of every golden run without
/// `-o json|yaml` (the command line itself aside).
#[test]
fn text_output_fits_80_columns() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or_default();
        if first.contains("-o json") || first.contains("-o yaml") {
            continue;
        }
        for line in text.lines().skip(1) {
            assert!(
                line.chars().count() <= 80,
                "{}: {line:?} is wider than 80 columns",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} text goldens");
}

/// The request-guard and hmac-auth plugins in the chain with what can be said of them offline (csrf's header,
/// hmac-auth's signature, client-control's limit, api-breaker's answer); the csrf key is
/// never printed.
#[test]
fn explain_describes_guard_and_hmac_plugins() {
    golden(
        "explain-guards-hmac",
        &[
            "explain",
            "http://any.example/good/x",
            "--ingress-class",
            "",
            "-f",
            "../lib/translate/testdata/apisix/plugins-guards-hmac.in.yaml",
        ],
        None,
    );
}

/// Layer-4 connections: a TCP stream port with ip-restriction (allowed and refused by the
/// client address), a TLS Gateway listener routing by SNI (exact, wildcard), an unknown SNI.
#[test]
fn explain_stream_connections() {
    let tcp = "../lib/translate/testdata/apisix/stream-tcp-udp.in.yaml";
    let ports = "tcp:9100,udp:9200,tls:9443";
    golden(
        "explain-stream-tcp",
        &[
            "explain",
            "tcp://:9100",
            "--client-ip",
            "10.0.0.5",
            "-f",
            tcp,
            "--stream-ports",
            ports,
        ],
        None,
    );
    golden(
        "explain-stream-tcp-refused",
        &["explain", "tcp://:9100", "-f", tcp, "--stream-ports", ports],
        None,
    );
    let tls = "../lib/translate/testdata/gateway/tlsroute-passthrough.in.yaml";
    let range = "20000-20099";
    golden(
        "explain-stream-tls-exact",
        &[
            "explain",
            "tls://foo.example.com:443",
            "-f",
            tls,
            "--gateway-listener-ports",
            range,
        ],
        None,
    );
    golden(
        "explain-stream-tls-wildcard-yaml",
        &[
            "explain",
            "tls://x.y.example.com:20035",
            "-f",
            tls,
            "--gateway-listener-ports",
            range,
            "-o",
            "yaml",
        ],
        None,
    );
    golden(
        "explain-stream-tls-unknown-sni",
        &[
            "explain",
            "tls://:443",
            "--sni",
            "db.example.org",
            "-f",
            tls,
            "--gateway-listener-ports",
            range,
        ],
        None,
    );
}
