//! Whatever a user writes, translation hands the dataplane a snapshot it compiles.
//!
//! Every node a user writes (`spec`, Secret `data`, annotations) of every golden input in
//! `lib/translate/testdata/<family>/` (Gateway API cases aside) is replaced in turn by
//! values of the wrong type, empty or out of range. Each result is translated and compiled as the dataplane compiles a pushed
//! snapshot. Neither may panic, every condition that turns an object away must name a
//! field, and the dataplane must accept the snapshot. A snapshot the
//! dataplane rejected would hold back every later change, so one bad object would disrupt
//! the others; translation must turn it away with a status naming the field instead.
//!
//! The second test mutates the translated snapshots themselves (and the plugin configs
//! inside them), as a faulty controller could push them: the dataplane compiles each or
//! refuses it with an error, never panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use serde_yaml::Value;
use sluice_dataplane::config::store::Store;
use sluice_translate::{ClusterState, Options, translate};

/// One step from a node to a child.
#[derive(Debug, Clone)]
enum Step {
    Key(Value),
    Index(usize),
}

fn bad_values() -> Vec<Value> {
    vec![
        Value::Null,
        Value::Bool(true),
        Value::from(-1),
        Value::from(0),
        Value::from(10_000_000_000_000_000_000u64),
        Value::from("x"),
        Value::from(""),
        // A regex that does not compile, text no header may carry, an address out of range.
        Value::from("(*"),
        Value::from("a b\r\n"),
        Value::from("999.0.0.1/33"),
        Value::Sequence(Vec::new()),
        Value::Mapping(Default::default()),
    ]
}

fn testdata() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_owned())
        .join("../lib/translate/testdata")
}

/// The golden inputs (the translate crate's harness layout, `sluice_translate::golden`),
/// Gateway API cases aside, sorted.
fn golden_inputs() -> Vec<PathBuf> {
    let cases = sluice_translate::golden::cases(&testdata()).unwrap();
    let mut inputs: Vec<PathBuf> = cases
        .into_iter()
        .filter(|c| c.family != sluice_translate::golden::GATEWAY_FAMILY)
        .map(|c| c.input)
        .collect();
    inputs.sort();
    inputs
}

/// A loopback port nothing listens on (endpoints are moved there before compiling).
fn closed_port() -> u16 {
    sluice_testkit::net::closed_port().port()
}

fn child<'a>(v: &'a mut Value, step: &Step) -> Option<&'a mut Value> {
    match (v, step) {
        (Value::Mapping(m), Step::Key(k)) => m.get_mut(k),
        (Value::Sequence(s), Step::Index(i)) => s.get_mut(*i),
        _ => None,
    }
}

/// Every node below `v` (itself included), as paths from `v`.
fn walk(v: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(at.clone());
    match v {
        Value::Mapping(m) => {
            for (k, x) in m {
                at.push(Step::Key(k.clone()));
                walk(x, at, out);
                at.pop();
            }
        }
        Value::Sequence(s) => {
            for (i, x) in s.iter().enumerate() {
                at.push(Step::Index(i));
                walk(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

/// The paths of the parts of `doc` a user writes.
fn user_paths(doc: &Value) -> Vec<Vec<Step>> {
    let mut out = Vec::new();
    let roots: [&[&str]; 4] = [
        &["spec"],
        &["data"],
        &["stringData"],
        &["metadata", "annotations"],
    ];
    for root in roots {
        let mut at: Vec<Step> = root.iter().map(|k| Step::Key(Value::from(*k))).collect();
        let mut node = Some(doc);
        for k in root.iter() {
            node = node.and_then(|n| n.get(*k));
        }
        if let Some(n) = node {
            walk(n, &mut at, &mut out);
        }
    }
    out
}

fn render(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn show(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(Value::String(k)) => format!(".{k}"),
            Step::Key(k) => format!(".{k:?}"),
            Step::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// How a condition message names a field of the object.
const FIELD_MARKS: [&str; 7] = [
    "spec.",
    "spec:",
    "spec[",
    "data.",
    "data:",
    "data[",
    "metadata.",
];

/// Translates `text` and compiles the snapshot in `store`; an error or panic is described.
fn check(store: &Store, version: u64, text: &str, closed_port: u16) -> Result<(), String> {
    let run = catch_unwind(AssertUnwindSafe(|| {
        let mut state = ClusterState::new();
        if state.load_yaml("mutated.yaml", text).is_err() {
            // A YAML syntax error: the file is refused as a whole, nothing to compile.
            return Ok(());
        }
        let t = translate(&state, &Options::default());
        // An object turned away says which field and why (e.g. `spec.http[0].match.paths`).
        for o in &t.status.objects {
            for c in &o.conditions {
                if c.status == sluice_translate::ConditionStatus::False
                    && !FIELD_MARKS.iter().any(|f| c.message.contains(f))
                {
                    return Err(format!(
                        "{} {}/{}: {} names no field: {}",
                        o.kind.as_str(),
                        o.namespace,
                        o.name,
                        c.type_,
                        c.message
                    ));
                }
            }
        }
        let mut snapshot = t.snapshot;
        snapshot.version = version;
        // NB: the probes of active health checks and DNS go to loopback only (the test
        // machine allows no other traffic); the addresses play no part in compiling.
        for up in &mut snapshot.upstreams {
            for e in &mut up.endpoints {
                e.host = "127.0.0.1".to_owned();
                e.port = u32::from(closed_port);
            }
        }
        store.apply(snapshot, Vec::new()).map_err(|e| e.to_string())
    }));
    match run {
        Ok(r) => r,
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        )),
    }
}

/// Runs every mutation of one golden input; returns how many ran and what failed.
fn mutate_case(path: &Path, closed_port: u16) -> (usize, Vec<String>) {
    let case = path.file_name().unwrap().to_string_lossy().into_owned();
    let input = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&input)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect();
    let store = Store::new().unwrap();
    let mut version = 1;
    let mut failures = Vec::new();
    if let Err(e) = check(&store, version, &render(&docs), closed_port) {
        failures.push(format!("{case} as written: {e}"));
    }
    let mut runs = 0;
    for (i, doc) in docs.iter().enumerate() {
        for p in user_paths(doc) {
            for bad in bad_values() {
                let mut mutated = docs.clone();
                let mut node = mutated.get_mut(i);
                for step in &p {
                    node = node.and_then(|n| child(n, step));
                }
                let Some(node) = node else { continue };
                *node = bad.clone();
                version += 1;
                runs += 1;
                if let Err(e) = check(&store, version, &render(&mutated), closed_port) {
                    failures.push(format!(
                        "{case} document {i}{} = {}: {e}",
                        show(&p),
                        serde_yaml::to_string(&bad).unwrap().trim()
                    ));
                }
            }
        }
    }
    (runs, failures)
}

#[test]
fn every_golden_input_mutated_translates_to_a_snapshot_the_dataplane_compiles() {
    let closed_port = closed_port();
    let cases = golden_inputs();
    assert!(cases.len() >= 30, "the golden inputs in {:?}", testdata());
    // Quiet the default hook: a panic is reported with the mutation that caused it.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let (halves, rest) = cases.split_at(cases.len() / 2);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            halves
                .iter()
                .map(|c| mutate_case(c, closed_port))
                .collect::<Vec<_>>()
        });
        let b = s.spawn(|| {
            rest.iter()
                .map(|c| mutate_case(c, closed_port))
                .collect::<Vec<_>>()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    std::panic::set_hook(hook);
    let results: Vec<_> = a.into_iter().chain(b).collect();
    let runs: usize = results.iter().map(|r| r.0).sum();
    let failures: Vec<&String> = results.iter().flat_map(|r| &r.1).collect();
    println!("{runs} mutations of {} inputs", cases.len());
    assert!(runs > 10_000, "only {runs} mutations");
    assert!(
        failures.is_empty(),
        "{} of {runs} mutations failed; the first 40:\n{}",
        failures.len(),
        failures
            .iter()
            .take(40)
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every node of `v` (JSON), as paths.
fn json_paths(v: &serde_json::Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(at.clone());
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                at.push(Step::Key(Value::from(k.as_str())));
                json_paths(x, at, out);
                at.pop();
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Step::Index(i));
                json_paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn json_child<'a>(v: &'a mut serde_json::Value, step: &Step) -> Option<&'a mut serde_json::Value> {
    match (v, step) {
        (serde_json::Value::Object(m), Step::Key(Value::String(k))) => m.get_mut(k),
        (serde_json::Value::Array(a), Step::Index(i)) => a.get_mut(*i),
        _ => None,
    }
}

/// The node of `v` at `path`.
fn json_at<'a>(v: &'a serde_json::Value, path: &[Step]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |n, step| match (n, step) {
        (serde_json::Value::Object(m), Step::Key(Value::String(k))) => m.get(k),
        (serde_json::Value::Array(a), Step::Index(i)) => a.get(*i),
        _ => None,
    })
}

/// A copy of `v` with the node at `path` replaced by `with`.
fn replaced(
    v: &serde_json::Value,
    path: &[Step],
    with: serde_json::Value,
) -> Option<serde_json::Value> {
    let mut copy = v.clone();
    let node = path
        .iter()
        .try_fold(&mut copy, |n, step| json_child(n, step))?;
    *node = with;
    Some(copy)
}

/// A snapshot is the controller's word, but a dataplane must survive a wrong one: every
/// node of the snapshot of each golden input, replaced in turn by an empty, zero, negative,
/// huge or meaningless value, either compiles or is rejected with an error (a NACK, the last
/// good snapshot keeps serving). Never a panic.
#[test]
fn every_golden_snapshot_mutated_compiles_or_is_refused_without_a_panic() {
    let closed_port = closed_port();
    // NB: the canonical JSON mapping writes 64-bit numbers as strings; both forms parse.
    let bad: Vec<serde_json::Value> = vec![
        serde_json::json!(null),
        serde_json::json!(""),
        serde_json::json!("x"),
        serde_json::json!("(*"),
        serde_json::json!(0),
        serde_json::json!(-1),
        serde_json::json!(true),
        serde_json::json!(u32::MAX),
        serde_json::json!(i32::MIN),
        serde_json::json!(u64::MAX.to_string()),
        serde_json::json!([]),
        serde_json::json!({}),
    ];
    let cases = golden_inputs();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let store = Store::new().unwrap();
    let (mut runs, mut compiled, mut version, mut in_configs) = (0usize, 0usize, 0u64, 0usize);
    let mut panics = Vec::new();
    for case in &cases {
        let mut state = ClusterState::new();
        state
            .load_yaml("golden.yaml", &std::fs::read_to_string(case).unwrap())
            .unwrap();
        let mut snapshot = translate(&state, &Options::default()).snapshot;
        for up in &mut snapshot.upstreams {
            for e in &mut up.endpoints {
                e.host = "127.0.0.1".to_owned();
                e.port = u32::from(closed_port);
            }
        }
        let json = serde_json::to_value(&snapshot).unwrap();
        let mut paths = Vec::new();
        json_paths(&json, &mut Vec::new(), &mut paths);
        // Each variant: where, and the whole mutated snapshot.
        let mut variants: Vec<(String, serde_json::Value)> = Vec::new();
        for p in paths.iter().skip(1) {
            for b in &bad {
                if let Some(mutated) = replaced(&json, p, b.clone()) {
                    variants.push((format!("{} = {b}", show(p)), mutated));
                }
            }
            // A plugin's config is JSON in a string: mutate inside it too.
            let Some(inner) = json_at(&json, p)
                .and_then(|n| n.as_str())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                .filter(|v| v.is_object())
            else {
                continue;
            };
            let mut inner_paths = Vec::new();
            json_paths(&inner, &mut Vec::new(), &mut inner_paths);
            for ip in inner_paths.iter().skip(1) {
                for b in &bad {
                    let Some(changed) = replaced(&inner, ip, b.clone()) else {
                        continue;
                    };
                    let text = serde_json::Value::String(changed.to_string());
                    if let Some(mutated) = replaced(&json, p, text) {
                        variants.push((format!("{} (config){} = {b}", show(p), show(ip)), mutated));
                    }
                }
            }
        }
        for (what, mutated) in variants {
            let Ok(mut snap) = serde_json::from_value::<sluice_proto::v1::Snapshot>(mutated) else {
                continue;
            };
            // Mutated endpoints stay on loopback too (no probe or DNS leaves the host).
            for up in &mut snap.upstreams {
                for e in &mut up.endpoints {
                    e.host = "127.0.0.1".to_owned();
                }
            }
            version += 1;
            snap.version = version;
            runs += 1;
            if what.contains("(config)") {
                in_configs += 1;
            }
            match catch_unwind(AssertUnwindSafe(|| store.apply(snap, Vec::new()))) {
                Ok(Ok(())) => compiled += 1,
                Ok(Err(_)) => {}
                Err(_) => panics.push(format!(
                    "{} snapshot{what}",
                    case.file_name().unwrap().to_string_lossy(),
                )),
            }
        }
    }
    std::panic::set_hook(hook);
    println!(
        "{runs} mutated snapshots ({in_configs} inside a plugin config), {compiled} compiled, the rest refused"
    );
    assert!(runs > 5_000, "only {runs} mutated snapshots");
    assert!(
        in_configs > 1_000,
        "only {in_configs} mutated plugin configs"
    );
    assert!(
        panics.is_empty(),
        "{} of {runs} mutated snapshots panicked; the first 40:\n{}",
        panics.len(),
        panics
            .iter()
            .take(40)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
