//! The dataplane's folders depend on each other one way only: a request climbs down from
//! the listener to the upstream, configuration flows in from the side, and the shared
//! helpers sit at the bottom. A `crate::` path in a folder that names a folder above it
//! (or a top-level module this list does not place) fails this test, so an import cycle
//! between folders cannot come back unnoticed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The top-level modules from the top of the request path down. A module may import the
/// ones after it, never the ones before it. Keep `src/lib.rs`'s picture in step.
/// The I/O plumbing below them all is the `sluice-io` crate (`lib/io`), which cannot import
/// the dataplane (cargo refuses a cycle).
const LAYERS: [&str; 8] = [
    "listener", "stream", "request", "config", "router", "plugins", "upstream", "http",
];

/// This crate's directory, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for
/// test processes). NB: not `env!` alone: CI keeps the build cache outside the clone.
fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments (`//` to the end of a line, `/* */`) and string literals,
/// so that a doc link or a message naming a module is not taken for an import.
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A char literal such as '"' must not open a string; lifetimes pass through.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                let len = if rest.starts_with('\\') {
                    rest.find('\'').map(|i| i + 1)
                } else if rest.chars().nth(1) == Some('\'') {
                    Some(2)
                } else {
                    None
                };
                match len {
                    Some(n) => {
                        for _ in 0..n {
                            chars.next();
                        }
                        out.push_str("' '");
                    }
                    None => out.push('\''),
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// The top-level modules `code` names through `crate::` (also `crate::{a, b}` groups).
fn crate_refs(code: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `sluice_crate::x` or `my_crate::x` are other paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let group = rest
            .strip_prefix('{')
            .map(|g| &g[..g.find('}').unwrap_or(g.len())]);
        let names: Vec<&str> = match group {
            Some(g) => g.split(',').collect(),
            None => vec![rest],
        };
        for name in names {
            let name: String = name
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                refs.push(name);
            }
        }
    }
    refs
}

/// The layering rule broken by a file of folder `from` whose code is `code`: each
/// `crate::` reference to a module above `from` or outside [`LAYERS`].
fn violations(from: &str, code: &str) -> Vec<String> {
    let Some(rank) = LAYERS.iter().position(|l| *l == from) else {
        return vec![format!(
            "top-level module `{from}` is not placed in LAYERS (tests/layering.rs)"
        )];
    };
    crate_refs(code)
        .into_iter()
        .filter_map(|to| match LAYERS.iter().position(|l| *l == to) {
            Some(r) if r >= rank => None,
            Some(_) => Some(format!("`{from}` imports `crate::{to}`, a layer above it")),
            None => Some(format!(
                "`{from}` names `crate::{to}`, a top-level module not placed in LAYERS"
            )),
        })
        .collect()
}

#[test]
fn folders_import_only_the_layers_below_them() {
    let src = manifest_dir().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut broken = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let mut parts = rel.iter().map(|p| p.to_string_lossy().into_owned());
        let first = parts.next().unwrap();
        let folder = match first.strip_suffix(".rs") {
            // The crate root and the binary wire the layers together.
            Some("lib" | "main") => continue,
            Some(module) => module.to_owned(),
            None => first,
        };
        seen.insert(folder.clone());
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for v in violations(&folder, &code) {
            broken.push(format!("{}: {v}", rel.display()));
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
    // Every layer exists, so a renamed folder is noticed here rather than silently unchecked.
    for layer in LAYERS {
        assert!(seen.contains(layer), "no folder `src/{layer}`");
    }
}

/// The plugin modules `code` names through `crate::plugins::` (not the framework or
/// support folders, and not the names `plugins` re-exports, which start upper-case or are
/// functions of the framework).
fn plugin_refs(code: &str, plugins: &[String]) -> Vec<String> {
    let mut refs = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::plugins::") {
        rest = &rest[at + "crate::plugins::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if plugins.contains(&name) {
            refs.push(name);
        }
    }
    refs
}

/// Inside `plugins/`, the helpers in `support/` serve the plugins and never import one (a
/// helper two plugins share lives in `support/`, not in one of them).
#[test]
fn plugin_support_imports_no_plugin() {
    let dir = manifest_dir().join("src/plugins");
    let plugins: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs")
                .filter(|n| *n != "mod")
                .map(str::to_owned)
        })
        .collect();
    assert!(plugins.contains(&"limit_count".to_owned()), "{plugins:?}");
    let mut files = Vec::new();
    rust_files(&dir.join("support"), &mut files);
    assert!(!files.is_empty(), "no src/plugins/support");
    let mut broken = Vec::new();
    for file in &files {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for p in plugin_refs(&code, &plugins) {
            broken.push(format!("{}: imports the plugin `{p}`", file.display()));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    assert_eq!(
        plugin_refs(
            "use crate::plugins::limit_count::Quota; use crate::plugins::{PluginCtx};",
            &plugins
        ),
        ["limit_count"]
    );
}

#[test]
fn an_upward_import_is_reported() {
    let upward = "use crate::request::handle;\nfn f() { crate::listener::server::serve(); }";
    assert_eq!(violations("upstream", upward).len(), 2);
    assert_eq!(
        violations(
            "plugins",
            "use crate::{upstream::Pool, config::store::Store};"
        )
        .len(),
        1
    );
    assert_eq!(violations("bogus", "").len(), 1, "an unplaced folder");
    assert!(violations("upstream", "use crate::newthing::X;")[0].contains("not placed"));
}

#[test]
fn comments_strings_and_downward_imports_are_not_reported() {
    let code = code_only(
        "/// See [`crate::request::handle`].\n\
         // crate::listener\n\
         /* crate::config */\n\
         let s = \"crate::request\"; let c = '\"'; let l: &'static str = s;\n\
         use crate::http::headers::HOP_BY_HOP;\n\
         use crate::upstream::{self, body::ProxyBody};",
    );
    assert!(violations("upstream", &code).is_empty(), "{code}");
    assert!(violations("request", "use crate::config::store::Store;").is_empty());
}
