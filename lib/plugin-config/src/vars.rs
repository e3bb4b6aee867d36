//! Request variables as APISIX (nginx) names them: `remote_addr`, `http_x_user`,
//! `arg_page`, `cookie_session`, ... Parsed once when a config is checked; the dataplane
//! reads them per request without parsing names.

/// One request variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// `remote_addr`: the client IP.
    RemoteAddr,
    /// `remote_port`.
    RemotePort,
    /// `server_addr`: the local address the connection arrived on.
    ServerAddr,
    /// `server_port`.
    ServerPort,
    /// `uri`: the path without the query.
    Uri,
    /// `request_uri`: path and query as sent.
    RequestUri,
    /// `args`: the query string.
    Args,
    /// `host`: the Host header without port.
    Host,
    /// `request_method`.
    RequestMethod,
    /// `scheme`: `http` or `https`.
    Scheme,
    /// `route_id`: the matched route's id.
    RouteId,
    /// `consumer_name`: the authenticated consumer.
    ConsumerName,
    /// `http_<name>`: a request header (name lower-case, `_` as `-`).
    Header(String),
    /// `arg_<name>`: a query argument.
    Arg(String),
    /// `cookie_<name>`: a cookie.
    Cookie(String),
}

impl Var {
    /// Parses an APISIX variable name (without `$`); `None` when unknown.
    pub fn parse(name: &str) -> Option<Var> {
        Some(match name {
            "remote_addr" => Var::RemoteAddr,
            "remote_port" => Var::RemotePort,
            "server_addr" => Var::ServerAddr,
            "server_port" => Var::ServerPort,
            "uri" => Var::Uri,
            "request_uri" => Var::RequestUri,
            "args" | "query_string" => Var::Args,
            "host" => Var::Host,
            "request_method" => Var::RequestMethod,
            "scheme" => Var::Scheme,
            "route_id" => Var::RouteId,
            "consumer_name" => Var::ConsumerName,
            _ => {
                if let Some(h) = name.strip_prefix("http_").filter(|h| !h.is_empty()) {
                    Var::Header(h.to_ascii_lowercase().replace('_', "-"))
                } else if let Some(a) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
                    Var::Arg(a.to_owned())
                } else if let Some(c) = name.strip_prefix("cookie_").filter(|c| !c.is_empty()) {
                    Var::Cookie(c.to_owned())
                } else {
                    return None;
                }
            }
        })
    }
}

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Text(String),
    /// A variable.
    Var(Var),
}

/// Text with `$var` / `${var}` references (APISIX `var_combination`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The pieces in order.
    pub pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; unknown variables are an error.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(pos) = rest.find('$') {
            lit.push_str(&rest[..pos]);
            rest = &rest[pos + 1..];
            let (name, after) = if let Some(r) = rest.strip_prefix('{') {
                let end = r
                    .find('}')
                    .ok_or_else(|| format!("unclosed `${{` in {text:?}"))?;
                (&r[..end], &r[end + 1..])
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if name.is_empty() {
                lit.push('$');
                rest = after;
                continue;
            }
            let var = Var::parse(name).ok_or_else(|| format!("unknown variable ${name}"))?;
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit)));
            }
            pieces.push(Piece::Var(var));
            rest = after;
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Var(_))) {
            return Err(format!("{text:?} references no variable"));
        }
        Ok(Template { pieces })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            Var::parse("http_x_api_key"),
            Some(Var::Header("x-api-key".into()))
        );
        assert_eq!(Var::parse("arg_page"), Some(Var::Arg("page".into())));
        assert_eq!(Var::parse("nope"), None);
    }

    #[test]
    fn templates() {
        let t = Template::parse("$remote_addr ${http_x}-z").unwrap();
        assert_eq!(
            t.pieces,
            vec![
                Piece::Var(Var::RemoteAddr),
                Piece::Text(" ".into()),
                Piece::Var(Var::Header("x".into())),
                Piece::Text("-z".into())
            ]
        );
        assert!(Template::parse("$bogus").is_err());
        assert!(Template::parse("plain").is_err());
    }
}
