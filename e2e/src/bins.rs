//! Binaries of other workspace crates (the echo backend, the dataplane, the controller).
//!
//! Cargo only hands a test the paths of its own package's binaries, so the harness builds the
//! others itself with the same cargo, profile and target directory as the running test (a
//! no-op when they are fresh) and returns their paths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::Error;
use crate::process::{check, run_output};

/// Where the running test executable's profile directory is (`target/debug` for
/// `target/debug/deps/foo-1234`).
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_owned)
    } else {
        Some(dir.to_owned())
    }
}

fn build(package: &str, bin: &str) -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("SLUICE_BIN_DIR") {
        let path = PathBuf::from(dir).join(bin);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingBinary {
                name: bin.to_owned(),
                path,
                why: "SLUICE_BIN_DIR is set but does not contain it".to_owned(),
            })
        };
    }
    let profile_dir = profile_dir().ok_or_else(|| Error::MissingBinary {
        name: bin.to_owned(),
        path: PathBuf::new(),
        why: "cannot locate the target directory of the running test".to_owned(),
    })?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let path = profile_dir.join(bin);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(crate::repo_root()).args([
        "build",
        "--quiet",
        "-p",
        package,
        "--bin",
        bin,
        "--profile",
        &profile,
    ]);
    if let Some(target_dir) = profile_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target_dir);
    }
    let how = format!("cargo build -p {package} --bin {bin} --profile {profile}");
    let out = run_output(&mut cmd, None, "").map_err(|e| Error::MissingBinary {
        name: bin.to_owned(),
        path: path.clone(),
        why: format!("{e}; build it with: {how}"),
    })?;
    check(&cmd, out).map_err(|e| Error::MissingBinary {
        name: bin.to_owned(),
        path: path.clone(),
        why: format!("{e}\nbuild it with: {how}"),
    })?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            name: bin.to_owned(),
            path,
            why: format!("`{how}` succeeded but produced no file there"),
        })
    }
}

/// Builds (if stale) and returns the path of binary `bin` of workspace package `package`,
/// e.g. `workspace_bin("sluice-dataplane", "sluice-dataplane")`. Built once per test process
/// with the running test's cargo (`$CARGO`), profile and target directory. With
/// `SLUICE_BIN_DIR` set, takes `$SLUICE_BIN_DIR/<bin>` as is and builds nothing.
pub fn workspace_bin(package: &str, bin: &str) -> Result<PathBuf, Error> {
    static BUILT: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(BTreeMap::new()));
    // NB: holding the lock while building keeps parallel tests from racing on one binary.
    let mut built = built.lock().unwrap_or_else(|poison| poison.into_inner());
    let key = format!("{package}/{bin}");
    if let Some(path) = built.get(&key) {
        return Ok(path.clone());
    }
    let path = build(package, bin)?;
    built.insert(key, path.clone());
    Ok(path)
}
