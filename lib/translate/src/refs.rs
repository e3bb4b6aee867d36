//! References from one namespace to another: who may name another namespace's objects.
//!
//! Every field of an APISIX kind that names an object by namespace goes through
//! [`Index::permit`]:
//!
//! | referring kind | field | target |
//! |---|---|---|
//! | ApisixUpstream | `spec.tlsSecret`, `spec.portLevelSettings[i].tlsSecret` | Secret |
//! | ApisixTls | `spec.secret` | Secret |
//! | ApisixTls | `spec.client.caSecret` | Secret |
//! | ApisixRoute | `spec.http[i].plugin_config_namespace` | ApisixPluginConfig |
//!
//! Every other reference of the APISIX kinds (backends, `upstreams`, plugin and consumer
//! `secretRef`s, `traffic-split` `upstream_id`s) and of Ingress (`secretName`, backends) is
//! to the object's own namespace by construction. The Gateway API's own references
//! (`backendRefs`, `certificateRefs`) are checked by the same [`granted`] in
//! [`crate::gateway`].
//!
//! By default ([`CrossNamespaceRefs::RequireGrant`]) a reference to another namespace is
//! honoured only if a Gateway API ReferenceGrant in the target's namespace allows it:
//! `from` group `apisix.apache.org`, the referring kind and its namespace; `to` the target's
//! group (`""` for a Secret) and kind, and a `name` that is unset or the target's. The
//! owner of the target namespace thus consents, as the Gateway API asks for the same
//! references. A refused reference is treated like a missing target (the object or rule is
//! rejected as it is today when the target does not exist) with reason `RefNotPermitted`
//! and a message naming the field, the target and what would allow it. With
//! [`CrossNamespaceRefs::Allow`] (`--allow-cross-namespace-refs`), every reference is
//! honoured as APISIX does.

use sluice_crds::gateway::ReferenceGrant;

use crate::Index;

/// API group of the APISIX kinds, the `from.group` a ReferenceGrant names for them.
pub const APISIX_GROUP: &str = "apisix.apache.org";
/// Reason of a condition when a cross-namespace reference is refused (the Gateway API's
/// name for the same refusal).
pub const REASON_REF_NOT_PERMITTED: &str = "RefNotPermitted";
/// The controller flag that honours every cross-namespace reference.
pub const ALLOW_CROSS_NAMESPACE_REFS_FLAG: &str = "--allow-cross-namespace-refs";

/// Which cross-namespace references of the APISIX kinds are honoured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CrossNamespaceRefs {
    /// The default: only those a ReferenceGrant in the target's namespace allows.
    #[default]
    RequireGrant,
    /// Every one, as APISIX does (`--allow-cross-namespace-refs`): any tenant able to write
    /// an ApisixTls or ApisixUpstream can then use any Secret the controller can read.
    Allow,
}

/// The object that refers: its kind (an APISIX kind) and namespace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Referrer<'a> {
    pub(crate) kind: &'static str,
    pub(crate) ns: &'a str,
}

/// The object referred to: group (`""` for core), kind, namespace and name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) group: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) ns: &'a str,
    pub(crate) name: &'a str,
}

impl<'a> Target<'a> {
    /// A core Secret.
    pub(crate) fn secret(ns: &'a str, name: &'a str) -> Self {
        Self {
            group: "",
            kind: "Secret",
            ns,
            name,
        }
    }
}

/// Whether `grants` in the target's namespace let a `from_group`/`from_kind` in `from_ns`
/// refer to `to` (a grant's `to.name`, when set, must be the target's).
pub(crate) fn granted(
    grants: &[ReferenceGrant],
    from_group: &str,
    from_kind: &str,
    from_ns: &str,
    to: Target<'_>,
) -> bool {
    grants.iter().any(|g| {
        crate::key(&g.metadata).0 == to.ns
            && g.spec
                .from
                .iter()
                .any(|f| f.group == from_group && f.kind == from_kind && f.namespace == from_ns)
            && g.spec.to.iter().any(|t| {
                t.group == to.group
                    && t.kind == to.kind
                    && t.name.as_deref().is_none_or(|n| n == to.name)
            })
    })
}

impl Index<'_> {
    /// `Ok` when `from` may refer to `to`: the same namespace, a ReferenceGrant allows it,
    /// or [`CrossNamespaceRefs::Allow`]. `Err` is the message of the refusal (without the
    /// field), for a `RefNotPermitted` condition.
    pub(crate) fn permit(&self, from: Referrer<'_>, to: Target<'_>) -> Result<(), String> {
        if to.ns == from.ns
            || self.cross_namespace_refs == CrossNamespaceRefs::Allow
            || granted(self.grants, APISIX_GROUP, from.kind, from.ns, to)
        {
            return Ok(());
        }
        Err(format!(
            "{kind} {ns}/{name} is in another namespace and no ReferenceGrant in namespace \
             {ns} allows {from_kind} from namespace {from_ns} to refer to it (cross-namespace \
             references need one, or the controller flag {ALLOW_CROSS_NAMESPACE_REFS_FLAG})",
            kind = to.kind,
            ns = to.ns,
            name = to.name,
            from_kind = from.kind,
            from_ns = from.ns,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{ClusterState, Options};

    fn state(grants: &str) -> ClusterState {
        let mut s = ClusterState::new();
        s.load_yaml("grants.yaml", grants).unwrap();
        s
    }

    const TLS_FROM_SHOP: Referrer<'static> = Referrer {
        kind: "ApisixTls",
        ns: "shop",
    };

    #[test]
    fn same_namespace_needs_nothing_and_another_needs_a_grant_there() {
        let s = state("");
        let idx = Index::build(&s, &Options::default());
        assert!(
            idx.permit(TLS_FROM_SHOP, Target::secret("shop", "c"))
                .is_ok()
        );
        let e = idx
            .permit(TLS_FROM_SHOP, Target::secret("other", "c"))
            .unwrap_err();
        assert!(
            e.contains("Secret other/c is in another namespace")
                && e.contains("ApisixTls from namespace shop")
                && e.contains(ALLOW_CROSS_NAMESPACE_REFS_FLAG),
            "{e}"
        );
        let opts = Options {
            cross_namespace_refs: CrossNamespaceRefs::Allow,
            ..Options::default()
        };
        let idx = Index::build(&s, &opts);
        assert!(
            idx.permit(TLS_FROM_SHOP, Target::secret("other", "c"))
                .is_ok()
        );
    }

    #[test]
    fn a_grant_must_match_every_part() {
        let grant = |ns: &str, from: &str, to: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n\
                 metadata: {{name: g, namespace: {ns}}}\nspec:\n  from: [{from}]\n  to: [{to}]\n"
            )
        };
        let from = "{group: apisix.apache.org, kind: ApisixTls, namespace: shop}";
        let to = "{group: \"\", kind: Secret}";
        let cases = [
            (grant("other", from, to), true),
            (
                grant("other", from, "{group: \"\", kind: Secret, name: c}"),
                true,
            ),
            (
                grant("other", from, "{group: \"\", kind: Secret, name: d}"),
                false,
            ),
            // In the referring namespace: the target's owner has not consented.
            (grant("shop", from, to), false),
            (
                grant(
                    "other",
                    "{group: gateway.networking.k8s.io, kind: ApisixTls, namespace: shop}",
                    to,
                ),
                false,
            ),
            (
                grant(
                    "other",
                    "{group: apisix.apache.org, kind: ApisixUpstream, namespace: shop}",
                    to,
                ),
                false,
            ),
            (
                grant(
                    "other",
                    "{group: apisix.apache.org, kind: ApisixTls, namespace: elsewhere}",
                    to,
                ),
                false,
            ),
            (
                grant(
                    "other",
                    from,
                    "{group: apisix.apache.org, kind: ApisixPluginConfig}",
                ),
                false,
            ),
        ];
        for (yaml, want) in cases {
            let s = state(&yaml);
            let idx = Index::build(&s, &Options::default());
            assert_eq!(
                idx.permit(TLS_FROM_SHOP, Target::secret("other", "c"))
                    .is_ok(),
                want,
                "{yaml}"
            );
        }
    }
}
