//! Every test file in `tests/` is declared in `Cargo.toml` behind the `system` feature (or
//! `measure`, which implies it). A file that is not would be built and run by a plain
//! `cargo test --workspace`, which must pass without root, network namespaces or the
//! cluster binaries; this test names the file and the stanza to add.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

/// `[[test]]` name → its `required-features` line, from the manifest text.
fn declared_tests(manifest: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut in_test = false;
    let mut name = None;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
            name = None;
            continue;
        }
        if !in_test {
            continue;
        }
        if let Some(v) = line.strip_prefix("name =") {
            name = Some(v.trim().trim_matches('"').to_owned());
        } else if let (Some(n), Some(v)) = (&name, line.strip_prefix("required-features =")) {
            out.insert(n.clone(), v.trim().to_owned());
        }
    }
    out
}

#[test]
fn every_test_file_is_in_the_system_tier() {
    let dir = manifest_dir();
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let declared = declared_tests(&manifest);
    let mut files: Vec<String> = std::fs::read_dir(dir.join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let features = declared.get(&file).unwrap_or_else(|| {
            panic!(
                "e2e/tests/{file}.rs is not gated: add to e2e/Cargo.toml\n\n[[test]]\nname = \"{file}\"\nrequired-features = [\"system\"]\n"
            )
        });
        assert!(
            features == r#"["system"]"# || features == r#"["measure"]"#,
            "e2e/tests/{file}.rs: required-features = {features}, expected [\"system\"] or [\"measure\"]"
        );
    }
}

#[test]
fn reads_the_stanzas() {
    let m = "[package]\nname = \"x\"\n\n[[test]]\nname = \"a\"\nrequired-features = [\"system\"]\n\n[[test]]\nname = \"b\"\n";
    let d = declared_tests(m);
    assert_eq!(d.get("a").map(String::as_str), Some(r#"["system"]"#));
    assert!(!d.contains_key("b"));
    assert!(!d.contains_key("x"));
}
