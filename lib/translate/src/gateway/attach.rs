//! Attaching a route to the listeners its `parentRefs` select: section name and port,
//! listener validity, allowed kinds and namespaces, hostname intersection. A `parentRef` of
//! kind `Gateway` selects the Gateway's own listeners, one of kind `ListenerSet` the set's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use sluice_crds::gateway::{GATEWAY_GROUP, ParentReference};

use super::http::RouteInput;
use super::listeners::{From, ListenerInfo};
use super::{ACCEPTED, Slot, cond, hostname, reason};
use crate::status::Condition;

/// Attachment of one route.
pub(super) struct Attachment {
    /// One `(parentRef, Accepted)` per parent Sluice owns, in spec order.
    pub(super) parents: Vec<(ParentReference, Condition)>,
    /// Hosts per slot (scheme or per-Gateway port): `None` in the map = every host.
    pub(super) schemes: BTreeMap<Slot, Option<BTreeSet<String>>>,
    /// Names of the Gateway listeners it serves through, per slot (`ListenerSection`s of a
    /// per-Gateway port).
    pub(super) sections: BTreeMap<Slot, BTreeSet<String>>,
    pub(super) any_attached: bool,
    pub(super) gateways: BTreeSet<(String, String)>,
}

/// ListenerSets by (namespace, name): their Gateway and whether the set is accepted.
pub(super) type Sets = BTreeMap<(String, String), ((String, String), bool)>;

/// Attaches `input` to the listeners its parentRefs select. `None` when no parentRef names
/// a Gateway of Sluice's classes or a ListenerSet of one.
pub(super) fn attach(
    input: &RouteInput<'_>,
    listeners: &mut [ListenerInfo],
    gw_accepted: &BTreeMap<(String, String), bool>,
    sets: &Sets,
    namespaces: &BTreeMap<&str, BTreeMap<String, String>>,
) -> Option<Attachment> {
    let mut att = Attachment {
        parents: Vec::new(),
        schemes: BTreeMap::new(),
        sections: BTreeMap::new(),
        any_attached: false,
        gateways: BTreeSet::new(),
    };
    // Invalid route hostnames are dropped (the API server's validation rejects them anyway).
    let route_hosts: Vec<String> = input
        .hostnames
        .iter()
        .filter_map(|h| hostname(h).ok())
        .collect();
    for p in input.parent_refs {
        let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = p.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || !matches!(kind, "Gateway" | "ListenerSet") {
            continue;
        }
        let parent_ns = p.namespace.as_deref().unwrap_or(input.ns).to_owned();
        let key = (parent_ns, p.name.clone());
        let (gw_key, set, ok) = if kind == "ListenerSet" {
            let Some((gw_key, ok)) = sets.get(&key) else {
                continue; // Not a ListenerSet of a Gateway of Sluice's classes.
            };
            (gw_key.clone(), Some(&key), *ok)
        } else {
            let Some(&ok) = gw_accepted.get(&key) else {
                continue; // Not a Gateway of Sluice's classes.
            };
            (key.clone(), None, ok)
        };
        let parent = Parent {
            input,
            p,
            gw_key: &gw_key,
            set,
            route_hosts: &route_hosts,
        };
        let accepted = if ok {
            parent.attach(listeners, namespaces, &mut att)
        } else {
            cond(
                ACCEPTED,
                false,
                reason::NO_MATCHING_PARENT,
                format!("{kind} {}/{} is not accepted", key.0, key.1),
            )
        };
        if accepted.status == crate::status::ConditionStatus::True {
            att.any_attached = true;
            att.gateways.insert(gw_key.clone());
        }
        att.parents.push((p.clone(), accepted));
    }
    (!att.parents.is_empty()).then_some(att)
}

/// One parentRef of a route, naming an accepted Gateway of Sluice's classes or an accepted
/// ListenerSet of one.
struct Parent<'r> {
    input: &'r RouteInput<'r>,
    p: &'r ParentReference,
    /// The Gateway the listeners serve on.
    gw_key: &'r (String, String),
    /// The ListenerSet named, `None` for the Gateway's own listeners.
    set: Option<&'r (String, String)>,
    /// The route's valid hostnames.
    route_hosts: &'r [String],
}

impl Parent<'_> {
    /// Attaches to the listeners this parentRef selects; the parent's `Accepted`.
    fn attach(
        &self,
        listeners: &mut [ListenerInfo],
        namespaces: &BTreeMap<&str, BTreeMap<String, String>>,
        att: &mut Attachment,
    ) -> Condition {
        let owner = match self.set {
            Some((ns, name)) => format!("ListenerSet {ns}/{name}"),
            None => format!("Gateway {}/{}", self.gw_key.0, self.gw_key.1),
        };
        let candidates = self.candidates(listeners);
        if candidates.is_empty() {
            return cond(
                ACCEPTED,
                false,
                reason::NO_MATCHING_PARENT,
                "no listener matches the parentRef's sectionName and port",
            );
        }
        let (valid, invalid): (Vec<usize>, Vec<usize>) = candidates
            .into_iter()
            .partition(|&i| listeners[i].attachable);
        if valid.is_empty() {
            let names: Vec<&str> = invalid
                .iter()
                .map(|&i| listeners[i].name.as_str())
                .collect();
            return cond(
                ACCEPTED,
                false,
                reason::NOT_ALLOWED_BY_LISTENERS,
                format!("listener(s) {} of {owner} are not valid", names.join(", ")),
            );
        }
        let allowed = self.allowed(listeners, valid, namespaces);
        if allowed.is_empty() {
            return cond(
                ACCEPTED,
                false,
                reason::NOT_ALLOWED_BY_LISTENERS,
                format!(
                    "no listener of {owner} allows {} from namespace {}",
                    self.input.kind.as_str(),
                    self.input.ns
                ),
            );
        }
        if !self.attach_hosts(listeners, allowed, att) {
            return cond(
                ACCEPTED,
                false,
                reason::NO_MATCHING_LISTENER_HOSTNAME,
                "no listener hostname intersects the route's hostnames",
            );
        }
        cond(ACCEPTED, true, reason::ACCEPTED, "Accepted")
    }

    /// Listeners of the Gateway (or ListenerSet) matching the parentRef's sectionName and
    /// port.
    fn candidates(&self, listeners: &[ListenerInfo]) -> Vec<usize> {
        listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.gateway == *self.gw_key
                    && l.set.as_ref() == self.set
                    && self.p.section_name.as_deref().is_none_or(|s| s == l.name)
                    && self.p.port.is_none_or(|port| port == l.port)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Those of `valid` that allow the route's kind from its namespace.
    fn allowed(
        &self,
        listeners: &[ListenerInfo],
        valid: Vec<usize>,
        namespaces: &BTreeMap<&str, BTreeMap<String, String>>,
    ) -> Vec<usize> {
        let input = self.input;
        valid
            .into_iter()
            .filter(|&i| {
                let l = &listeners[i];
                l.kinds.contains(&input.kind)
                    && match &l.from {
                        From::All => true,
                        From::Same => l.namespace == input.ns,
                        From::Selector(sel) => namespaces
                            .get(input.ns)
                            .is_some_and(|labels| selects(sel, labels)),
                    }
            })
            .collect()
    }

    /// Attaches to each of `allowed` whose hostname intersects the route's, adding the hosts
    /// to the listener's slot; whether any matched.
    fn attach_hosts(
        &self,
        listeners: &mut [ListenerInfo],
        allowed: Vec<usize>,
        att: &mut Attachment,
    ) -> bool {
        let input = self.input;
        let mut matched = false;
        for i in allowed {
            let l = &mut listeners[i];
            // `None`: every host.
            let hosts = intersect(l.hostname.as_deref(), self.route_hosts);
            if hosts.as_ref().is_some_and(Vec::is_empty) {
                continue;
            }
            matched = true;
            l.attached
                .insert((input.kind, input.ns.to_owned(), input.name.to_owned()));
            if !l.usable {
                // NB: attached (and counted), but the listener serves nothing yet.
                continue;
            }
            att.sections
                .entry(l.slot.clone())
                .or_default()
                .insert(l.section.clone());
            let slot = att
                .schemes
                .entry(l.slot.clone())
                .or_insert_with(|| Some(BTreeSet::new()));
            match (slot.as_mut(), hosts) {
                (_, None) => *slot = None,
                (Some(set), Some(h)) => set.extend(h),
                (None, Some(_)) => {}
            }
        }
        matched
    }
}

/// Whether pattern `p` (exact or `*.suffix`, any depth) matches host `h` (exact or wildcard).
fn host_matches(p: &str, h: &str) -> bool {
    match p.strip_prefix('*') {
        None => p == h,
        // "*.example.com" matches "a.example.com", "a.b.example.com" and "*.b.example.com",
        // never "example.com".
        Some(dot_suffix) => h.len() > dot_suffix.len() && h.ends_with(dot_suffix),
    }
}

/// Hosts a route serves through a listener: `None` = every host; `Some(empty)` = none.
fn intersect(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    match (listener, route.is_empty()) {
        (None, true) => None,
        (None, false) => Some(route.to_vec()),
        (Some(l), true) => Some(vec![l.to_owned()]),
        (Some(l), false) => Some(
            route
                .iter()
                .filter_map(|r| {
                    if host_matches(l, r) {
                        Some(r.clone())
                    } else if host_matches(r, l) {
                        Some(l.to_owned())
                    } else {
                        None
                    }
                })
                .collect(),
        ),
    }
}

/// Whether a label selector matches `labels` (matchLabels and matchExpressions).
pub(super) fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn namespace_selectors() {
        let sel: LabelSelector = serde_yaml::from_str(
            "matchLabels: {team: a}\nmatchExpressions:\n\
             - {key: env, operator: In, values: [prod, staging]}\n\
             - {key: blocked, operator: DoesNotExist}\n",
        )
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert!(selects(&sel, &labels(&[("team", "a"), ("env", "prod")])));
        assert!(!selects(&sel, &labels(&[("team", "a"), ("env", "dev")])));
        assert!(!selects(&sel, &labels(&[("team", "b"), ("env", "prod")])));
        assert!(!selects(
            &sel,
            &labels(&[("team", "a"), ("env", "prod"), ("blocked", "")])
        ));
        let unknown_op: LabelSelector =
            serde_yaml::from_str("matchExpressions: [{key: a, operator: Gt, values: ['1']}]")
                .unwrap();
        assert!(!selects(&unknown_op, &labels(&[("a", "2")])), "fail closed");
    }

    #[test]
    fn wildcards_match_any_depth_but_not_the_bare_suffix() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(host_matches("*.example.com", "*.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "aexample.com"));
        assert!(!host_matches("a.example.com", "*.example.com"));
    }

    #[test]
    fn hostname_intersection() {
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(intersect(None, &[]), None);
        assert_eq!(intersect(Some("a.com"), &[]), Some(v(&["a.com"])));
        assert_eq!(intersect(None, &v(&["a.com"])), Some(v(&["a.com"])));
        assert_eq!(
            intersect(
                Some("*.example.com"),
                &v(&["a.example.com", "example.com", "x.b.example.com"])
            ),
            Some(v(&["a.example.com", "x.b.example.com"]))
        );
        assert_eq!(
            intersect(Some("a.example.com"), &v(&["*.example.com", "other.com"])),
            Some(v(&["a.example.com"]))
        );
        assert_eq!(
            intersect(Some("*.example.com"), &v(&["*.a.example.com"])),
            Some(v(&["*.a.example.com"]))
        );
        assert_eq!(intersect(Some("a.com"), &v(&["b.com"])), Some(Vec::new()));
    }
}
