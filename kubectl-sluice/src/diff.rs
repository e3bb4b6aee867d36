//! `diff`: what changes in the snapshot between two configurations (files against files, or
//! files against what a running dataplane serves), as added / removed / changed routes,
//! upstreams, certificates, global rules and consumers.
//!
//! Secret material is never printed: values are shown from redacted copies
//! ([`sluice_dataplane::config::redact`]), certificates and keys only as "changed" with a
//! short SHA-256 of the public chain. A running dataplane's snapshot is itself redacted, so
//! against one both sides are compared redacted (a change of a secret alone is not seen).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sluice_dataplane::config::redact::redacted;
use sluice_proto::v1;

/// Longest value shown inline in a change; longer ones are named only.
const MAX_INLINE: usize = 60;

/// One changed item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// `route`, `upstream`, `certificate`, `global-rule`, `consumer` or `snapshot`.
    pub kind: String,
    /// Its id (name for consumers).
    pub id: String,
    /// `added`, `removed` or `changed`.
    pub op: String,
    /// For `changed`: each differing field, `field: old -> new` when short.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// The result of `diff`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Changes grouped by kind (routes, upstreams, certificates, global rules, consumers):
    /// removed and changed ones by id, then added ones by id.
    pub changes: Vec<Change>,
}

fn short(v: &serde_json::Value) -> Option<String> {
    let s = v.to_string();
    (s.len() <= MAX_INLINE).then_some(s)
}

/// Field-level differences of two serialisable items, shown from their redacted forms.
fn fields_of(
    old: &serde_json::Value,
    new: &serde_json::Value,
    old_shown: &serde_json::Value,
    new_shown: &serde_json::Value,
) -> Vec<String> {
    let empty = serde_json::Map::new();
    let o = old.as_object().unwrap_or(&empty);
    let n = new.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    let null = serde_json::Value::Null;
    keys.into_iter()
        .filter(|k| o.get(*k) != n.get(*k))
        .map(|k| {
            let a = old_shown.get(k).unwrap_or(&null);
            let b = new_shown.get(k).unwrap_or(&null);
            if let (Some(x), Some(y)) = (a.as_array(), b.as_array()) {
                return format!("{k}: {}", list_change(x, y));
            }
            match (short(a), short(b)) {
                (Some(a), Some(b)) if a != b => format!("{k}: {a} -> {b}"),
                _ => format!("{k}: changed"),
            }
        })
        .collect()
}

/// A list element named for a change line: an endpoint as `host:port`, a plugin by name.
fn label(v: &serde_json::Value) -> String {
    if let (Some(h), Some(p)) = (v.get("host"), v.get("port")) {
        return format!("{}:{}", h.as_str().unwrap_or_default(), p);
    }
    if let Some(n) = v.get("name").and_then(|n| n.as_str()) {
        return n.to_owned();
    }
    if let Some(text) = v.as_str() {
        return text.to_owned();
    }
    short(v).unwrap_or_else(|| "(entry)".into())
}

/// `+added -removed ~changed` elements of a list, by label.
fn list_change(old: &[serde_json::Value], new: &[serde_json::Value]) -> String {
    let index = |l: &[serde_json::Value]| -> BTreeMap<String, serde_json::Value> {
        l.iter().map(|v| (label(v), v.clone())).collect()
    };
    let (a, b) = (index(old), index(new));
    let mut parts = Vec::new();
    for (k, v) in &b {
        match a.get(k) {
            None => parts.push(format!("+{k}")),
            Some(o) if o != v => parts.push(format!("~{k}")),
            Some(_) => {}
        }
    }
    parts.extend(
        a.keys()
            .filter(|k| !b.contains_key(*k))
            .map(|k| format!("-{k}")),
    );
    if parts.is_empty() {
        "order changed".into()
    } else {
        parts.join(" ")
    }
}

fn digest(pem: &str) -> String {
    let d = Sha256::digest(pem.as_bytes());
    hex::encode(&d[..6])
}

fn cert_fields(old: &v1::TlsCertificate, new: &v1::TlsCertificate) -> Vec<String> {
    let mut out = Vec::new();
    if old.hosts != new.hosts {
        out.push(format!("hosts: {:?} -> {:?}", old.hosts, new.hosts));
    }
    if old.source != new.source {
        out.push(format!("source: {:?} -> {:?}", old.source, new.source));
    }
    if old.cert_chain_pem != new.cert_chain_pem {
        out.push(format!(
            "certificate chain: sha256 {} -> {}",
            digest(&old.cert_chain_pem),
            digest(&new.cert_chain_pem)
        ));
    }
    if old.private_key_pem != new.private_key_pem {
        out.push("private key: changed".into());
    }
    let rest = |c: &v1::TlsCertificate| v1::TlsCertificate {
        id: String::new(),
        source: String::new(),
        hosts: Vec::new(),
        cert_chain_pem: String::new(),
        private_key_pem: String::new(),
        ..c.clone()
    };
    if rest(old) != rest(new) {
        out.push("client authentication: changed".into());
    }
    out
}

/// Compares items of one kind keyed by id.
/// `old` and `new` are (compared, shown) pairs of lists in the same order.
fn compare<T: Serialize + PartialEq>(
    kind: &str,
    (old, old_shown): (&[T], &[T]),
    (new, new_shown): (&[T], &[T]),
    id: impl Fn(&T) -> String,
    fields: impl Fn(&T, &T, &T, &T) -> Vec<String>,
    out: &mut Vec<Change>,
) {
    let index = |list: &[T]| -> BTreeMap<String, usize> {
        list.iter().enumerate().map(|(i, t)| (id(t), i)).collect()
    };
    let a = index(old);
    let b = index(new);
    for (k, &i) in &a {
        match b.get(k) {
            None => out.push(Change {
                kind: kind.into(),
                id: k.clone(),
                op: "removed".into(),
                fields: Vec::new(),
            }),
            Some(&j) => {
                let (Some(o), Some(n), Some(os), Some(ns)) =
                    (old.get(i), new.get(j), old_shown.get(i), new_shown.get(j))
                else {
                    continue;
                };
                if o != n {
                    out.push(Change {
                        kind: kind.into(),
                        id: k.clone(),
                        op: "changed".into(),
                        fields: fields(o, n, os, ns),
                    });
                }
            }
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(Change {
            kind: kind.into(),
            id: k.clone(),
            op: "added".into(),
            fields: Vec::new(),
        });
    }
}

fn json_fields<T: Serialize>(o: &T, n: &T, os: &T, ns: &T) -> Vec<String> {
    let v = |t: &T| serde_json::to_value(t).unwrap_or_default();
    fields_of(&v(o), &v(n), &v(os), &v(ns))
}

/// Differences from `old` (what is served, or `--against`) to `new` (the files). With
/// `redact_both`, both sides are compared redacted (the old side came from a dataplane).
pub fn diff(old: &v1::Snapshot, new: &v1::Snapshot, redact_both: bool) -> Report {
    let (old_shown, new_shown) = (redacted(old), redacted(new));
    let (old, new) = if redact_both {
        (&old_shown, &new_shown)
    } else {
        (old, new)
    };
    let mut changes = Vec::new();
    compare(
        "route",
        (&old.routes, &old_shown.routes),
        (&new.routes, &new_shown.routes),
        |r| r.id.clone(),
        json_fields,
        &mut changes,
    );
    compare(
        "upstream",
        (&old.upstreams, &old_shown.upstreams),
        (&new.upstreams, &new_shown.upstreams),
        |u| u.id.clone(),
        json_fields,
        &mut changes,
    );
    compare(
        "certificate",
        (&old.tls_certificates, &old_shown.tls_certificates),
        (&new.tls_certificates, &new_shown.tls_certificates),
        |c| c.id.clone(),
        |o, n, _, _| cert_fields(o, n),
        &mut changes,
    );
    compare(
        "global-rule",
        (&old.global_rules, &old_shown.global_rules),
        (&new.global_rules, &new_shown.global_rules),
        |g| g.id.clone(),
        json_fields,
        &mut changes,
    );
    compare(
        "consumer",
        (&old.consumers, &old_shown.consumers),
        (&new.consumers, &new_shown.consumers),
        |c| c.name.clone(),
        // NB: a consumer is mostly credentials; say which plugin changed, never the values.
        |o, n, _, _| {
            let names = |c: &v1::Consumer| c.plugins.iter().map(|p| p.name.clone()).collect();
            let (a, b): (Vec<String>, Vec<String>) = (names(o), names(n));
            vec![format!("plugins {a:?} -> {b:?} (values not shown)")]
        },
        &mut changes,
    );
    if old.default_certificate != new.default_certificate {
        changes.push(Change {
            kind: "snapshot".into(),
            id: "default_certificate".into(),
            op: "changed".into(),
            fields: Vec::new(),
        });
    }
    if old.fallback_sni != new.fallback_sni {
        changes.push(Change {
            kind: "snapshot".into(),
            id: "fallback_sni".into(),
            op: "changed".into(),
            fields: vec![format!("{:?} -> {:?}", old.fallback_sni, new.fallback_sni)],
        });
    }
    Report { changes }
}

impl Report {
    /// Exit code, as diff(1) and `kubectl diff`: 0 no changes, 1 changes.
    pub fn exit_code(&self) -> i32 {
        if self.changes.is_empty() { 0 } else { 1 }
    }

    /// Text for a terminal: `+` added, `-` removed, `~` changed.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let (mut added, mut removed, mut changed) = (0, 0, 0);
        for c in &self.changes {
            let sign = match c.op.as_str() {
                "added" => {
                    added += 1;
                    '+'
                }
                "removed" => {
                    removed += 1;
                    '-'
                }
                _ => {
                    changed += 1;
                    '~'
                }
            };
            let _ = writeln!(out, "{sign} {} {}", c.kind, c.id);
            for f in &c.fields {
                let _ = writeln!(out, "    {f}");
            }
        }
        let _ = writeln!(
            out,
            "{} changes: {added} added, {removed} removed, {changed} changed",
            self.changes.len()
        );
        out
    }
}
