//! Rules on snapshot fields that both sides apply: translate, so a user gets a status
//! condition, and the dataplane, which re-validates every snapshot it receives. Keeping
//! them here keeps the two from drifting apart.

/// Longest host name accepted, in bytes.
pub const MAX_HOST_LEN: usize = 255;

/// A DNS name: dot-separated non-empty labels of ASCII letters, digits, `-` and `_`, at
/// most [`MAX_HOST_LEN`] bytes. IPv4 literals have the same shape and pass too.
pub fn dns_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_HOST_LEN {
        return Err(format!("longer than {MAX_HOST_LEN} bytes"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label (leading, trailing or double dot)".into());
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!("invalid character {c:?} in host name"));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::dns_name;

    #[test]
    fn dns_names() {
        assert!(dns_name("a-b.example_1.com").is_ok());
        assert!(dns_name("10.0.0.1").is_ok());
        assert!(dns_name("a..com").unwrap_err().contains("empty label"));
        assert!(
            dns_name("a b.com")
                .unwrap_err()
                .contains("invalid character ' '")
        );
        assert!(
            dns_name(&"a".repeat(256))
                .unwrap_err()
                .contains("longer than 255")
        );
    }
}
