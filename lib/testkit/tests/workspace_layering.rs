//! The workspace's crates depend on each other one way: libraries at the bottom, the two
//! programs (dataplane, controller) above them, the `kubectl sluice` application on top, and
//! the test and benchmark crates beside everything. A `[dependencies]` entry that names a
//! crate at the same level or above, a dev-dependency on the application, or a workspace
//! member this table does not place fails here. The test kit sits below the programs: it
//! names neither the dataplane nor the controller in any section, so every crate (theirs
//! included) can use it without a second copy of their types. (Inside the dataplane, its folders have their
//! own order: `dataplane/tests/layering.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Workspace member path → (crate name, level). A crate's normal dependencies must have a
/// lower level. `None`: a test or benchmark crate, which may use any crate but nothing may
/// depend on it outside `[dev-dependencies]`.
const LEVELS: &[(&str, &str, Option<u8>)] = &[
    ("crds", "sluice-crds", Some(0)),
    ("lib/proto", "sluice-proto", Some(0)),
    ("lib/process", "sluice-process", Some(0)),
    ("lib/io", "sluice-io", Some(0)),
    ("lib/plugin-config", "sluice-plugin-config", Some(1)),
    ("lib/translate", "sluice-translate", Some(2)),
    ("dataplane", "sluice-dataplane", Some(3)),
    ("controller", "sluice-controller", Some(4)),
    ("kubectl-sluice", "sluice-kubectl", Some(5)),
    ("lib/testkit", "sluice-testkit", None),
    ("e2e", "sluice-e2e", None),
    ("bench", "sluice-bench", None),
];

/// The application on top: nothing depends on it, not even a test crate.
const APPLICATION: &str = "sluice-kubectl";

/// The test kit and the level its dependencies, dev-dependencies included, must stay below
/// (the dataplane's): the in-process dataplane and controller harnesses stay in their own
/// crates' `tests/common/`.
const KIT: (&str, u8) = ("sluice-testkit", 3);

fn workspace_root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
        })
        .unwrap()
        .to_owned()
}

/// The `members = [...]` of the root manifest.
fn members(root_manifest: &str) -> Vec<String> {
    let start = root_manifest.find("members = [").unwrap();
    let end = start + root_manifest[start..].find(']').unwrap();
    root_manifest[start..end]
        .lines()
        .skip(1)
        .map(|l| l.trim().trim_end_matches(',').trim_matches('"'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// (section, crate name) of every `sluice-*` dependency in a member's manifest.
fn sluice_deps(manifest: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            continue;
        }
        if section.ends_with("dependencies") && line.starts_with("sluice-") {
            let name = line
                .split(|c: char| c == '=' || c == '.' || c.is_whitespace())
                .next()
                .unwrap();
            out.push((section.clone(), name.to_owned()));
        }
    }
    out
}

fn level_of(name: &str) -> Option<&'static (&'static str, &'static str, Option<u8>)> {
    LEVELS.iter().find(|(_, n, _)| *n == name)
}

fn violations(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let root_manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for member in members(&root_manifest) {
        let Some((_, name, level)) = LEVELS.iter().find(|(p, _, _)| *p == member) else {
            bad.push(format!("workspace member {member} is not placed in LEVELS"));
            continue;
        };
        let manifest = std::fs::read_to_string(root.join(&member).join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{member}/Cargo.toml is not {name}"
        );
        for (section, dep) in sluice_deps(&manifest) {
            let Some((_, _, dep_level)) = level_of(&dep) else {
                bad.push(format!("{name}: [{section}] {dep} is not placed in LEVELS"));
                continue;
            };
            if dep == APPLICATION {
                bad.push(format!(
                    "{name}: [{section}] {dep}: the application is on top, nothing depends on it"
                ));
                continue;
            }
            if *name == KIT.0 && dep_level.is_none_or(|d| d >= KIT.1) {
                bad.push(format!(
                    "{name}: [{section}] {dep}: the kit stays below the dataplane and the controller"
                ));
                continue;
            }
            if section != "dependencies" && section != "build-dependencies" {
                continue; // dev-dependencies: tests may use anything below the application
            }
            match (level, dep_level) {
                (Some(l), Some(d)) if d >= l => bad.push(format!(
                    "{name} (level {l}): [{section}] {dep} (level {d}) points up or sideways"
                )),
                (Some(_), None) => bad.push(format!(
                    "{name}: [{section}] {dep} is a test crate: only [dev-dependencies] may name it"
                )),
                _ => {}
            }
        }
    }
    bad
}

#[test]
fn no_crate_depends_on_one_above_it() {
    let bad = violations(&workspace_root());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_parsers_read_what_the_rules_need() {
    let m = "[package]\nname = \"sluice-x\"\n\n[dependencies]\nsluice-proto.workspace = true\nsluice-controller = { path = \"../controller\" }\nserde = \"1\"\n\n[dev-dependencies]\nsluice-e2e = { path = \"../e2e\" }\n";
    assert_eq!(
        sluice_deps(m),
        vec![
            ("dependencies".into(), "sluice-proto".into()),
            ("dependencies".into(), "sluice-controller".into()),
            ("dev-dependencies".into(), "sluice-e2e".into()),
        ]
    );
    let root = "[workspace]\nmembers = [\n    \"crds\",\n    \"lib/proto\",\n]\n";
    assert_eq!(members(root), vec!["crds", "lib/proto"]);
}
