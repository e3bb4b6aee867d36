//! `kubectl sluice migrate`: what Sluice will do with Ingresses written for ingress-nginx,
//! per Ingress and per `nginx.ingress.kubernetes.io/*` annotation: served as is, served
//! differently (and how), refused (and why: the Ingress is then not served), or ignored.
//! The verdicts are the controller's own: the annotation table
//! (`sluice_translate::nginx::ANNOTATIONS`) and a translation of the same files with the
//! classes served in ingress-nginx's place, so a value the controller would refuse (a bad
//! CIDR, a regex it cannot run) is reported here too.

use serde::Serialize;
use sluice_translate::files::Loaded;
use sluice_translate::nginx::{self, Support};
use sluice_translate::{Options, translate};

use crate::table::Table;

/// One annotation of one Ingress.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The annotation, without `nginx.ingress.kubernetes.io/`.
    pub annotation: String,
    /// `served`, `served differently`, `refused`, `ignored`, or `unknown` (not an
    /// annotation ingress-nginx documents; ignored).
    pub verdict: &'static str,
    /// How it differs, or why it is refused or ignored.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// One Ingress.
#[derive(Debug, Clone, Serialize)]
pub struct IngressReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Whether Sluice would serve it (`Accepted=True`).
    pub served: bool,
    /// Its ingress-nginx annotations.
    pub annotations: Vec<Row>,
    /// The controller's reasons for refusing it, or its notes when served.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The classes taken over.
    pub classes: Vec<String>,
    /// Each Ingress of those classes, by namespace and name.
    pub ingresses: Vec<IngressReport>,
}

/// The report for the Ingresses of `classes` in `loaded`.
pub fn migrate(loaded: &Loaded, classes: &[String]) -> Report {
    let opts = Options {
        ingress_class: None,
        now: Some(std::time::SystemTime::now()),
        nginx_classes: classes.to_vec(),
        ..Options::default()
    };
    let t = translate(&loaded.state, &opts);
    let mut ingresses = Vec::new();
    for ing in &loaded.state.ingresses {
        let class = ing
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref())
            .or_else(|| {
                ing.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("kubernetes.io/ingress.class"))
                    .map(String::as_str)
            });
        if !class.is_some_and(|c| classes.iter().any(|n| n == c)) {
            continue;
        }
        let namespace = ing
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = ing.metadata.name.clone().unwrap_or_default();
        let annotations = ing
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter_map(|(k, _)| k.strip_prefix(nginx::PREFIX))
            .map(|a| match nginx::support(a) {
                Some(s) => Row {
                    annotation: a.to_owned(),
                    verdict: s.verdict(),
                    detail: s.why().to_owned(),
                },
                None => Row {
                    annotation: a.to_owned(),
                    verdict: "unknown",
                    detail: "not an annotation ingress-nginx documents; ignored".into(),
                },
            })
            .collect();
        let status = t
            .ingresses
            .iter()
            .find(|s| s.namespace == namespace && s.name == name);
        let accepted = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Accepted"));
        let served = accepted.is_some_and(|c| format!("{:?}", c.status) == "True");
        let messages = accepted
            .map(|c| {
                c.message
                    .split("; ")
                    .filter(|m| !m.is_empty() && *m != "Accepted")
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        ingresses.push(IngressReport {
            namespace,
            name,
            served,
            annotations,
            messages,
        });
    }
    ingresses.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Report {
        classes: classes.to_vec(),
        ingresses,
    }
}

impl Report {
    /// 0 when every Ingress would be served, 1 when one would not.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.ingresses.iter().any(|i| !i.served))
    }

    /// The table: one row per annotation (an Ingress without any gets one row), the reason
    /// under each row that has one, then the totals.
    pub fn render_text(&self) -> String {
        let mut table = Table::new(&["INGRESS", "ANNOTATION", "SLUICE"]);
        for i in &self.ingresses {
            let who = format!(
                "{}/{}{}",
                i.namespace,
                i.name,
                if i.served { "" } else { " (REFUSED)" }
            );
            if i.annotations.is_empty() {
                table.row(vec![who.clone(), "-".into(), "served".into()]);
            }
            for r in &i.annotations {
                let details = if r.detail.is_empty() {
                    Vec::new()
                } else {
                    vec![r.detail.clone()]
                };
                table.row_with(
                    vec![who.clone(), r.annotation.clone(), r.verdict.into()],
                    details,
                );
            }
            if !i.served {
                // NB: the refusals of annotations are listed above already.
                let refused: Vec<String> = i
                    .annotations
                    .iter()
                    .filter(|r| r.verdict == "refused")
                    .map(|r| format!("\"{}{}\"", nginx::PREFIX, r.annotation))
                    .collect();
                for m in i
                    .messages
                    .iter()
                    .filter(|m| !refused.iter().any(|r| m.contains(r.as_str())))
                {
                    table.row_with(
                        vec![who.clone(), "(controller)".into(), "refused".into()],
                        vec![m.clone()],
                    );
                }
            }
        }
        let mut out = table.render();
        let count = |v: &str| {
            self.ingresses
                .iter()
                .flat_map(|i| &i.annotations)
                .filter(|r| r.verdict == v)
                .count()
        };
        let refused = self.ingresses.iter().filter(|i| !i.served).count();
        out.push_str(&format!(
            "\n{} Ingresses of class {}: {} served, {} refused. Annotations: {} served, {} served differently, {} refused, {} ignored, {} unknown.\n",
            self.ingresses.len(),
            self.classes.join(", "),
            self.ingresses.len() - refused,
            refused,
            count(Support::Same.verdict()),
            count("served differently"),
            count("refused"),
            count("ignored"),
            count("unknown"),
        ));
        out
    }
}
