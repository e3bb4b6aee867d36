//! lua-resty-expr as plugin `vars` conditions use it: `[[var, op, value], ...]` (all must
//! hold), `["OR" | "AND" | "!OR" | "!AND", rule, rule, ...]` (nesting), a `"!"` before the
//! operator to negate it, and `[var, value]` for `==`.
//!
//! Operators: `==`, `~=`, `>`, `>=`, `<`, `<=` (numeric when the value is a number),
//! `~~` (regex), `~*` (case-insensitive regex), `in`, `has`, `ipmatch`. Variables: the
//! request variables of [`crate::vars::Var`] plus `status` (the response status, only
//! meaningful in response phases).

use ipnet::IpNet;
use regex::{Regex, RegexBuilder};
use serde_json::Value;

use crate::FieldError;
use crate::vars::Var;

/// A variable an expression reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExprVar {
    /// A request variable.
    Req(Var),
    /// `status`: the response status.
    Status,
}

/// A comparison.
#[derive(Debug, Clone)]
pub enum ExprOp {
    /// `==` with a string.
    Eq(String),
    /// `==` with a number.
    EqNum(f64),
    /// `>`, `>=`, `<`, `<=` with a number: (ordering wanted, or-equal).
    Cmp(std::cmp::Ordering, bool, f64),
    /// `~~` / `~*`.
    Regex(Regex),
    /// `in`: one of these values.
    In(Vec<String>),
    /// `has`: the variable (a comma/space separated list) holds this value.
    Has(String),
    /// `ipmatch`: the variable is an IP inside one of these networks.
    IpMatch(Vec<IpNet>),
}

/// A compiled condition.
#[derive(Debug, Clone)]
pub enum Expr {
    /// All must hold (the top level, `AND`).
    All(Vec<Expr>),
    /// One must hold (`OR`).
    Any(Vec<Expr>),
    /// Negated (`!AND`, `!OR`).
    Not(Box<Expr>),
    /// One comparison.
    Cond {
        /// The variable.
        var: ExprVar,
        /// Negated with `!`.
        negate: bool,
        /// The comparison.
        op: ExprOp,
    },
}

fn value_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn net(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

fn compile_cond(field: &str, items: &[Value]) -> Result<Expr, FieldError> {
    let err = |r: String| FieldError::new(field, r);
    let name = items
        .first()
        .and_then(Value::as_str)
        .ok_or_else(|| err("the first element must be a variable name".into()))?;
    let var = if name == "status" {
        ExprVar::Status
    } else {
        ExprVar::Req(
            Var::parse(name.strip_prefix('$').unwrap_or(name))
                .ok_or_else(|| err(format!("unknown variable {name:?}")))?,
        )
    };
    let mut rest = &items[1..];
    let mut negate = false;
    if rest.len() == 3 && rest.first().and_then(Value::as_str) == Some("!") {
        negate = true;
        rest = &rest[1..];
    }
    // NB: lua-resty-expr's compatibility form `[var, value]` means `==`.
    let eq = Value::String("==".into());
    let (op, val) = match rest {
        [val] => (&eq, val),
        [op, val] => (op, val),
        _ => {
            return Err(err(
                "expected [var, operator, value] or [var, \"!\", operator, value]".into(),
            ));
        }
    };
    let Some(op) = op.as_str() else {
        return Err(err("the operator must be a string".into()));
    };
    let num = val.as_f64();
    let op = match op.to_ascii_lowercase().as_str() {
        "==" => match num {
            Some(n) => ExprOp::EqNum(n),
            None => {
                ExprOp::Eq(value_string(val).ok_or_else(|| err("value must be a scalar".into()))?)
            }
        },
        "~=" => {
            negate = !negate;
            match num {
                Some(n) => ExprOp::EqNum(n),
                None => ExprOp::Eq(
                    value_string(val).ok_or_else(|| err("value must be a scalar".into()))?,
                ),
            }
        }
        o @ (">" | ">=" | "<" | "<=") => {
            let n = num
                .or_else(|| val.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| err(format!("{o} needs a number")))?;
            let ord = if o.starts_with('>') {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Less
            };
            ExprOp::Cmp(ord, o.ends_with('='), n)
        }
        o @ ("~~" | "~*") => {
            let pat = val
                .as_str()
                .ok_or_else(|| err(format!("{o} needs a regex string")))?;
            ExprOp::Regex(
                RegexBuilder::new(pat)
                    .case_insensitive(o == "~*")
                    .build()
                    .map_err(|e| err(format!("bad regex: {e}")))?,
            )
        }
        "in" => {
            let Value::Array(list) = val else {
                return Err(err("in needs an array".into()));
            };
            ExprOp::In(
                list.iter()
                    .map(|v| value_string(v).ok_or_else(|| err("in values must be scalars".into())))
                    .collect::<Result<_, _>>()?,
            )
        }
        "has" => {
            ExprOp::Has(value_string(val).ok_or_else(|| err("value must be a scalar".into()))?)
        }
        "ipmatch" => {
            let list: Vec<&str> = match val {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => return Err(err("ipmatch needs an IP/CIDR or an array of them".into())),
            };
            ExprOp::IpMatch(
                list.iter()
                    .map(|s| net(s).ok_or_else(|| err(format!("{s:?} is not an IP or CIDR"))))
                    .collect::<Result<_, _>>()?,
            )
        }
        other => {
            return Err(err(format!(
                "operator {other:?} is not supported (supported: ==, ~=, >, >=, <, <=, ~~, ~*, \
                 in, has, ipmatch, with an optional \"!\")"
            )));
        }
    };
    Ok(Expr::Cond { var, negate, op })
}

fn compile_list(field: &str, items: &[Value]) -> Result<Vec<Expr>, FieldError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| compile_rule(&format!("{field}[{i}]"), v))
        .collect()
}

/// lua-resty-expr's `compile`: a list of rules (AND), a logic operator with its rules, or
/// one comparison.
fn compile_rule(field: &str, v: &Value) -> Result<Expr, FieldError> {
    let Value::Array(items) = v else {
        return Err(FieldError::new(field, "must be an array"));
    };
    match items.first() {
        None => Err(FieldError::new(field, "rule too short")),
        Some(Value::Array(_)) => Ok(Expr::All(compile_list(field, items)?)),
        Some(Value::String(s)) => match logic_op(s) {
            Some((any, not)) => {
                if items.len() <= 2 {
                    return Err(FieldError::new(field, "rule too short"));
                }
                let inner = compile_list(field, &items[1..])?;
                let e = if any {
                    Expr::Any(inner)
                } else {
                    Expr::All(inner)
                };
                Ok(if not { Expr::Not(Box::new(e)) } else { e })
            }
            None => compile_cond(field, items),
        },
        Some(_) => Err(FieldError::new(
            field,
            "must be [var, operator, value] or a list of them",
        )),
    }
}

/// `OR`, `AND`, `!OR`, `!AND`: (any, negated).
fn logic_op(s: &str) -> Option<(bool, bool)> {
    match s.to_ascii_uppercase().as_str() {
        "AND" => Some((false, false)),
        "OR" => Some((true, false)),
        "!AND" => Some((false, true)),
        "!OR" => Some((true, true)),
        _ => None,
    }
}

/// Compiles one lua-resty-expr expression (field `field`): a list of rules
/// (`[[var, op, value], ...]`, all must hold) or `["OR"|"AND"|"!OR"|"!AND", rule, ...]`.
/// An empty list always holds. A bare `[var, op, value]` is rejected, as
/// lua-resty-expr does ("wrap it in brackets").
pub fn compile(field: &str, v: &Value) -> Result<Expr, FieldError> {
    let Value::Array(items) = v else {
        return Err(FieldError::new(
            field,
            "must be an array of [var, operator, value]",
        ));
    };
    match items.first() {
        None => Ok(Expr::All(Vec::new())),
        Some(Value::String(s)) if logic_op(s).is_none() => Err(FieldError::new(
            field,
            format!(
                "a rule must be wrapped inside brackets: [[{}, ...]]",
                Value::String(s.clone())
            ),
        )),
        Some(_) => compile_rule(field, v),
    }
}

/// Compiles a list of expressions of which one must hold (fault-injection's `vars`:
/// `[[[var, op, value], ...], ...]`).
pub fn compile_any(field: &str, v: &Value) -> Result<Expr, FieldError> {
    let Value::Array(items) = v else {
        return Err(FieldError::new(field, "must be an array of expressions"));
    };
    if items.is_empty() {
        return Ok(Expr::All(Vec::new()));
    }
    Ok(Expr::Any(
        items
            .iter()
            .enumerate()
            .map(|(i, e)| compile(&format!("{field}[{i}]"), e))
            .collect::<Result<_, _>>()?,
    ))
}

impl Expr {
    /// Whether this reads the response status.
    pub fn uses_status(&self) -> bool {
        match self {
            Expr::All(v) | Expr::Any(v) => v.iter().any(Expr::uses_status),
            Expr::Not(e) => e.uses_status(),
            Expr::Cond { var, .. } => *var == ExprVar::Status,
        }
    }

    /// Evaluates with `get` reading a variable (`None` when absent).
    pub fn eval<'a>(
        &self,
        get: &mut dyn FnMut(&ExprVar) -> Option<std::borrow::Cow<'a, str>>,
    ) -> bool {
        match self {
            Expr::All(v) => v.iter().all(|e| e.eval(get)),
            Expr::Any(v) => v.iter().any(|e| e.eval(get)),
            Expr::Not(e) => !e.eval(get),
            Expr::Cond { var, negate, op } => {
                let val = get(var);
                let hit = match (op, val.as_deref()) {
                    (_, None) => false,
                    (ExprOp::Eq(s), Some(v)) => v == s,
                    (ExprOp::EqNum(n), Some(v)) => v.trim().parse::<f64>().is_ok_and(|x| x == *n),
                    (ExprOp::Cmp(ord, or_eq, n), Some(v)) => v
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .and_then(|x| x.partial_cmp(n))
                        .is_some_and(|o| o == *ord || (*or_eq && o.is_eq())),
                    (ExprOp::Regex(re), Some(v)) => re.is_match(v),
                    (ExprOp::In(list), Some(v)) => list.iter().any(|s| s == v),
                    (ExprOp::Has(s), Some(v)) => v
                        .split(|c: char| c == ',' || c.is_whitespace())
                        .any(|p| p == s),
                    (ExprOp::IpMatch(nets), Some(v)) => v
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| nets.iter().any(|n| n.contains(&ip))),
                };
                hit != *negate
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::borrow::Cow;

    fn eval(e: &Value, vals: &[(&str, &str)]) -> bool {
        let x = compile("vars", e).unwrap();
        x.eval(&mut |v| {
            let name = match v {
                ExprVar::Status => "status".to_owned(),
                ExprVar::Req(Var::Arg(a)) => format!("arg_{a}"),
                ExprVar::Req(Var::Header(h)) => format!("http_{h}"),
                ExprVar::Req(Var::RemoteAddr) => "remote_addr".to_owned(),
                _ => return None,
            };
            vals.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| Cow::Owned(v.to_string()))
        })
    }

    #[test]
    fn operators() {
        assert!(eval(&json!([["arg_a", "==", "x"]]), &[("arg_a", "x")]));
        assert!(!eval(&json!([["arg_a", "==", "x"]]), &[]));
        assert!(eval(&json!([["arg_a", "~=", "x"]]), &[("arg_a", "y")]));
        assert!(eval(&json!([["status", ">=", 500]]), &[("status", "503")]));
        assert!(!eval(&json!([["status", "==", 200]]), &[("status", "503")]));
        assert!(eval(&json!([["arg_a", "~~", "^a+$"]]), &[("arg_a", "aaa")]));
        assert!(eval(
            &json!([["arg_a", "!", "in", ["x", "y"]]]),
            &[("arg_a", "z")]
        ));
        assert!(eval(
            &json!([["remote_addr", "ipmatch", ["10.0.0.0/8"]]]),
            &[("remote_addr", "10.1.2.3")]
        ));
        assert!(eval(
            &json!([["OR", ["arg_a", "==", "1"], ["arg_b", "==", "2"]]]),
            &[("arg_b", "2")]
        ));
        assert!(eval(&json!([]), &[]));
        assert!(
            eval(&json!([["arg_a", "x"]]), &[("arg_a", "x")]),
            "[var, value] is =="
        );
        assert!(eval(
            &json!(["!OR", ["arg_a", "==", "1"], ["arg_b", "==", "2"]]),
            &[("arg_b", "3")]
        ));
        assert!(
            eval(&json!([["arg_a", "!", "==", "x"]]), &[]),
            "absent is not x"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let e = compile("vars", &json!([["arg_a", "like", "x"]])).unwrap_err();
        assert_eq!(e.field, "vars[0]");
        assert!(
            e.reason.contains("\"like\" is not supported"),
            "{}",
            e.reason
        );
        let e = compile("vars", &json!([["nope", "==", "x"]])).unwrap_err();
        assert!(e.reason.contains("unknown variable"), "{}", e.reason);
        assert!(compile("vars", &json!("x")).is_err());
        let e = compile("vars", &json!(["arg_a", "==", "x"])).unwrap_err();
        assert!(e.reason.contains("wrapped inside brackets"), "{}", e.reason);
        let e = compile("vars", &json!([["OR", ["arg_a", "==", "x"]]])).unwrap_err();
        assert_eq!(e.reason, "rule too short");
    }
}
