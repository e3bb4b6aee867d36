//! Finding (or building) the `sluice-dataplane` binary and its command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::BenchError;

/// The scenario's standalone YAML: `<workspace>/bench/config/scenario<N>.yaml`.
pub fn scenario_config(workspace: &Path, scenario: u8) -> PathBuf {
    workspace
        .join("bench")
        .join("config")
        .join(format!("scenario{scenario}.yaml"))
}

/// The dataplane's arguments for the benchmark: standalone file, loopback
/// listeners, one worker (as in the APISIX single-worker benchmark).
pub fn args(config: &Path, http_port: u16, admin_port: u16) -> Vec<String> {
    vec![
        "--standalone".into(),
        config.display().to_string(),
        "--listen-http".into(),
        format!("127.0.0.1:{http_port}"),
        // Loopback only; `sluice-bench tls` replaces it with a real port.
        "--listen-https".into(),
        "127.0.0.1:0".into(),
        "--admin".into(),
        format!("127.0.0.1:{admin_port}"),
        "--workers".into(),
        "1".into(),
    ]
}

/// Checks a user-supplied `--sluice-bin`.
pub fn check_given_binary(path: &Path) -> Result<PathBuf, BenchError> {
    if path.is_file() {
        Ok(path.to_owned())
    } else {
        Err(BenchError::SluiceUnavailable(format!(
            "--sluice-bin {} is not a file",
            path.display()
        )))
    }
}

/// Builds `sluice-dataplane` with `cargo build --release` in `workspace` and
/// returns the path cargo reports for the executable. Compiler diagnostics go
/// to the terminal.
pub fn build_release(workspace: &Path) -> Result<PathBuf, BenchError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("sluice-bench: building sluice-dataplane (cargo build --release) ...");
    let out = Command::new(cargo)
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "-p",
            "sluice-dataplane",
            "--bin",
            "sluice-dataplane",
            "--message-format=json-render-diagnostics",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| BenchError::SluiceUnavailable(format!("could not run cargo: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::SluiceUnavailable(format!(
            "`cargo build --release -p sluice-dataplane` failed ({}); see the compiler output above",
            out.status
        )));
    }
    executable_from_cargo_json(&String::from_utf8_lossy(&out.stdout), "sluice-dataplane")
        .ok_or_else(|| {
            BenchError::SluiceUnavailable("cargo reported no sluice-dataplane executable".into())
        })
}

/// Finds the `executable` of binary target `bin` in cargo's
/// `--message-format=json` output.
pub fn executable_from_cargo_json(output: &str, bin: &str) -> Option<PathBuf> {
    output
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == bin)
        .filter(|v| {
            v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .next_back()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_executable_in_cargo_messages() {
        let out = r#"{"reason":"compiler-artifact","target":{"name":"sluice_proto","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"sluice-dataplane","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"sluice-dataplane","kind":["bin"]},"executable":"/w/target/release/sluice-dataplane"}
{"reason":"build-finished","success":true}
"#;
        assert_eq!(
            executable_from_cargo_json(out, "sluice-dataplane"),
            Some(PathBuf::from("/w/target/release/sluice-dataplane"))
        );
        assert_eq!(executable_from_cargo_json(out, "other"), None);
        assert_eq!(
            executable_from_cargo_json("not json\n", "sluice-dataplane"),
            None
        );
    }

    #[test]
    fn dataplane_args_follow_the_cli_contract() {
        let a = args(Path::new("/w/bench/config/scenario1.yaml"), 9081, 9091);
        assert_eq!(
            a.join(" "),
            "--standalone /w/bench/config/scenario1.yaml --listen-http 127.0.0.1:9081 --listen-https 127.0.0.1:0 \
             --admin 127.0.0.1:9091 --workers 1"
        );
    }

    #[test]
    fn missing_binary_is_reported() {
        let e = check_given_binary(Path::new("/nonexistent/sluice")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/sluice"), "{e}");
    }

    #[test]
    fn scenario_paths() {
        assert_eq!(
            scenario_config(Path::new("/w"), 2),
            PathBuf::from("/w/bench/config/scenario2.yaml")
        );
    }
}
