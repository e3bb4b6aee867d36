//! ApisixUpstream `loadbalancer.hashOn` and `key`: validation and conversion into the
//! snapshot.

use sluice_crds::{HashOn, LoadBalancer};
use sluice_proto::v1;

use crate::problems::Problems;

/// Variables `hashOn: vars` may name (as APISIX allows), besides `arg_*`, `http_*` and
/// `cookie_*`.
const HASH_VARS: [&str; 9] = [
    "uri",
    "server_name",
    "server_addr",
    "request_uri",
    "remote_port",
    "remote_addr",
    "query_string",
    "host",
    "hostname",
];

/// Whether `name` is a variable the dataplane can hash on.
pub(crate) fn known_var(name: &str) -> bool {
    HASH_VARS.contains(&name)
        || ["arg_", "http_", "cookie_"]
            .iter()
            .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
}

/// `loadbalancer.hashOn` and `key`, validated. `None` when the load balancer sets neither.
pub(crate) fn hash_on(
    lb: &LoadBalancer,
    field: &str,
    problems: &mut Problems,
) -> Option<(v1::UpstreamHashOn, String)> {
    if lb.hash_on.is_none() && lb.key.is_none() {
        return None;
    }
    let on = lb.hash_on.unwrap_or_default();
    let key = lb.key.clone().unwrap_or_default();
    let kfield = format!("{field}loadbalancer.key");
    let proto = match on {
        HashOn::Vars => {
            if !key.is_empty() && !known_var(&key) {
                problems.error(
                    &kfield,
                    format!(
                        "{key:?} is not a variable Sluice can hash on (one of {}, or arg_*, http_*, cookie_*)",
                        HASH_VARS.join(", ")
                    ),
                );
            }
            v1::UpstreamHashOn::Vars
        }
        HashOn::Header | HashOn::Cookie => {
            if key.is_empty() {
                problems.error(
                    &kfield,
                    format!("required when hashOn is {}", hash_on_name(on)),
                );
            } else if !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                problems.error(&kfield, format!("{key:?} is not a header or cookie name"));
            }
            if on == HashOn::Header {
                v1::UpstreamHashOn::Header
            } else {
                v1::UpstreamHashOn::Cookie
            }
        }
        HashOn::Consumer => v1::UpstreamHashOn::Consumer,
        HashOn::VarsCombinations => {
            match template_vars(&key) {
                Err(e) => problems.error(&kfield, e),
                Ok(vars) => {
                    for v in vars {
                        if !known_var(v) {
                            problems.error(
                                &kfield,
                                format!("${v} is not a variable Sluice can hash on"),
                            );
                        }
                    }
                }
            }
            v1::UpstreamHashOn::VarsCombinations
        }
    };
    Some((proto, key))
}

fn hash_on_name(on: HashOn) -> &'static str {
    match on {
        HashOn::Vars => "vars",
        HashOn::Header => "header",
        HashOn::Cookie => "cookie",
        HashOn::Consumer => "consumer",
        HashOn::VarsCombinations => "vars_combinations",
    }
}

/// The `$name` variables of a `vars_combinations` template such as `$host-$remote_addr`.
pub(crate) fn template_vars(t: &str) -> Result<Vec<&str>, String> {
    if !t.contains('$') {
        return Err(format!(
            "{t:?} names no variable (write e.g. `$host$remote_addr`)"
        ));
    }
    let mut vars = Vec::new();
    let mut rest = t;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if end == 0 {
            return Err(format!("{t:?}: `$` without a variable name"));
        }
        vars.push(&after[..end]);
        rest = &after[end..];
    }
    Ok(vars)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_vars() {
        assert_eq!(
            template_vars("$host-$remote_addr").unwrap(),
            vec!["host", "remote_addr"]
        );
        assert!(template_vars("host").is_err());
        assert!(template_vars("a$").is_err());
        assert!(known_var("arg_user"));
        assert!(!known_var("arg_"));
        assert!(!known_var("nope"));
    }
}
