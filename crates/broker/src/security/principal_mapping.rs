//! Kafka's `ssl.principal.mapping.rules`: how a client certificate's subject becomes the
//! name of its `User:` principal.
//!
//! ```text
//! RULE:^CN=([^,]+),OU=eng,.*$/$1/L,DEFAULT
//! ```
//!
//! Rules are tried in order; the first whose pattern matches the whole subject (RFC 2253
//! text) gives the name: the replacement with `$1`… filled in, then lower-cased (`/L`) or
//! upper-cased (`/U`). `DEFAULT` is the subject unchanged. A subject no rule matches is
//! refused, as Kafka refuses it.

use regex::Regex;

/// A rule list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ssl principal mapping rules: {0}")]
pub struct MappingRulesError(String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Replace {
        pattern: Regex,
        /// In the regex crate's syntax (`${1}`), translated from Java's (`$1`).
        replacement: String,
        case: Case,
    },
}

/// Parsed `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

impl Default for PrincipalMapper {
    fn default() -> Self {
        Self {
            rules: vec![Rule::Default],
        }
    }
}

/// Reads up to the next unescaped `/`, returning the text (escapes kept) and what follows it.
fn until_slash(text: &str) -> Option<(&str, &str)> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '/' => return Some((&text[..i], &text[i + 1..])),
            _ => {}
        }
    }
    None
}

/// Java's replacement syntax (`$1`, `\$` for a literal) in the regex crate's.
fn replacement(java: &str) -> String {
    let mut out = String::new();
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push_str("${");
                while let Some(d) = chars.next_if(char::is_ascii_digit) {
                    out.push(d);
                }
                out.push('}');
            }
            '$' => out.push_str("$$"),
            other => out.push(other),
        }
    }
    out
}

impl PrincipalMapper {
    /// Parses a comma-separated rule list (`DEFAULT`, `RULE:pattern/replacement/[LU]`).
    pub fn parse(text: &str) -> Result<Self, MappingRulesError> {
        let bad = |m: String| Err(MappingRulesError(m));
        let mut rules = Vec::new();
        let mut rest = text.trim_start();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let Some((pattern, after)) = until_slash(after) else {
                    return bad(format!("{rest:?}: no `/` after the pattern"));
                };
                let Some((java_replacement, after)) = until_slash(after) else {
                    return bad(format!("{rest:?}: no `/` after the replacement"));
                };
                let (case, after) = match after.chars().next() {
                    Some('L') => (Case::Lower, &after[1..]),
                    Some('U') => (Case::Upper, &after[1..]),
                    _ => (Case::Keep, after),
                };
                // Anchored: Kafka applies a rule only when its pattern matches the whole name.
                let pattern = Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| MappingRulesError(format!("pattern {pattern:?}: {e}")))?;
                rules.push(Rule::Replace {
                    pattern,
                    replacement: replacement(java_replacement),
                    case,
                });
                rest = after;
            } else {
                return bad(format!(
                    "{rest:?} is not DEFAULT or RULE:pattern/replacement/"
                ));
            }
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after.trim_start();
                if rest.is_empty() {
                    return bad("a trailing comma".into());
                }
            } else if !rest.is_empty() {
                return bad(format!("{rest:?}: expected `,` between rules"));
            }
        }
        if rules.is_empty() {
            return bad("no rule (DEFAULT keeps the subject as it is)".into());
        }
        Ok(Self { rules })
    }

    /// The principal name for the certificate subject `dn`, or None when no rule matches.
    pub fn map(&self, dn: &str) -> Option<String> {
        for rule in &self.rules {
            match rule {
                Rule::Default => return Some(dn.to_string()),
                Rule::Replace {
                    pattern,
                    replacement,
                    case,
                } => {
                    if !pattern.is_match(dn) {
                        continue;
                    }
                    let name = pattern.replace(dn, replacement.as_str()).into_owned();
                    return Some(match case {
                        Case::Keep => name,
                        Case::Lower => name.to_lowercase(),
                        Case::Upper => name.to_uppercase(),
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_the_subject() {
        let m = PrincipalMapper::parse("DEFAULT").unwrap();
        assert_eq!(m.map("CN=a,O=b").as_deref(), Some("CN=a,O=b"));
        assert_eq!(
            PrincipalMapper::default().map("CN=a").as_deref(),
            Some("CN=a")
        );
    }

    // The examples of Kafka's documentation and SslPrincipalMapperTest.
    #[test]
    fn rules_apply_in_order_first_match_wins_with_case() {
        let m = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/ , RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,\
             RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT",
        )
        .unwrap();
        assert_eq!(
            m.map("CN=kafka-server1,OU=ServiceUsers,O=Org,C=US")
                .as_deref(),
            Some("kafka-server1")
        );
        assert_eq!(
            m.map("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Palo Alto,ST=CA,C=US")
                .as_deref(),
            Some("duke@javasoft")
        );
        assert_eq!(
            m.map("OU=JavaSoft,CN=duke.x,O=Sun").as_deref(),
            Some("DUKE.X")
        );
        assert_eq!(m.map("O=nobody").as_deref(), Some("O=nobody"));
    }

    #[test]
    fn a_subject_no_rule_matches_has_no_principal() {
        let m = PrincipalMapper::parse("RULE:^CN=(.*)$/$1/").unwrap();
        assert_eq!(m.map("OU=x,CN=y"), None);
        assert_eq!(m.map("CN=y").as_deref(), Some("y"));
    }

    #[test]
    fn escaped_slashes_dollars_and_adjacent_text() {
        let m = PrincipalMapper::parse(r"RULE:^CN=(.*)\/(.*)$/$2x\$$1/").unwrap();
        assert_eq!(m.map("CN=a/b").as_deref(), Some("bx$a"));
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in [
            "",
            "DEFAULT,",
            "RULE:^CN=(.*)$",
            "RULE:^CN=(.*)$/$1",
            "RULE:^CN=((.*)$/$1/",
            "default",
            "DEFAULT DEFAULT",
            "RULE:a/b/X",
        ] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad:?}");
        }
    }
}
