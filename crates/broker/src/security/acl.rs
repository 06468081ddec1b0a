//! Kafka's ACL model and its authorizer's rules, with no IO: a binding is a resource pattern
//! and an access entry; a [`AclSnapshot`] is every binding of the cluster at one moment, and
//! answers "may this principal, from this host, do this to that resource" the way Kafka's
//! AclAuthorizer does:
//!
//! - super users may do everything;
//! - a binding applies to a resource when its pattern is the resource's name (LITERAL), the
//!   wildcard `*` (LITERAL), or a prefix of it (PREFIXED); to the principal when it names it
//!   or `User:*`; to the host when it names the client's address or `*`;
//! - a DENY of the operation (or of ALL) wins over any ALLOW;
//! - an ALLOW of ALL allows every operation; DESCRIBE is allowed by READ, WRITE, DELETE or
//!   ALTER, and DESCRIBE_CONFIGS by ALTER_CONFIGS (never the other way, and never for DENY);
//! - a resource no binding applies to (for any principal) is allowed only with
//!   `allow_everyone_if_no_acl_found`.
//!
//! The storage and the cache that keeps a snapshot current are in [`super::acl_store`].

use std::collections::HashMap;
use std::fmt;

/// The resource types Strata authorizes (Kafka's codes in [`ResourceType::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
    DelegationToken,
}

impl ResourceType {
    pub const ALL: [ResourceType; 5] = [
        Self::Topic,
        Self::Group,
        Self::Cluster,
        Self::TransactionalId,
        Self::DelegationToken,
    ];

    pub fn code(self) -> i8 {
        match self {
            Self::Topic => 2,
            Self::Group => 3,
            Self::Cluster => 4,
            Self::TransactionalId => 5,
            Self::DelegationToken => 6,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }

    /// Kafka's name (`TOPIC`); the stored key uses it in lower case.
    pub fn name(self) -> &'static str {
        match self {
            Self::Topic => "TOPIC",
            Self::Group => "GROUP",
            Self::Cluster => "CLUSTER",
            Self::TransactionalId => "TRANSACTIONAL_ID",
            Self::DelegationToken => "DELEGATION_TOKEN",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

/// The one name a CLUSTER resource has.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// The literal name that matches every resource of its type.
pub const WILDCARD: &str = "*";

/// How a binding's name is matched against a resource's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PatternType {
    Literal,
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            Self::Literal => 3,
            Self::Prefixed => 4,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            3 => Some(Self::Literal),
            4 => Some(Self::Prefixed),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Literal => "LITERAL",
            Self::Prefixed => "PREFIXED",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Literal, Self::Prefixed]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }
}

/// Kafka's ACL operations (the token operations are not modelled: Strata has no tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    pub const EVERY: [Operation; 11] = [
        Self::All,
        Self::Read,
        Self::Write,
        Self::Create,
        Self::Delete,
        Self::Alter,
        Self::Describe,
        Self::ClusterAction,
        Self::DescribeConfigs,
        Self::AlterConfigs,
        Self::IdempotentWrite,
    ];

    pub fn code(self) -> i8 {
        match self {
            Self::All => 2,
            Self::Read => 3,
            Self::Write => 4,
            Self::Create => 5,
            Self::Delete => 6,
            Self::Alter => 7,
            Self::Describe => 8,
            Self::ClusterAction => 9,
            Self::DescribeConfigs => 10,
            Self::AlterConfigs => 11,
            Self::IdempotentWrite => 12,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Self::EVERY.into_iter().find(|o| o.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::All => "ALL",
            Self::Read => "READ",
            Self::Write => "WRITE",
            Self::Create => "CREATE",
            Self::Delete => "DELETE",
            Self::Alter => "ALTER",
            Self::Describe => "DESCRIBE",
            Self::ClusterAction => "CLUSTER_ACTION",
            Self::DescribeConfigs => "DESCRIBE_CONFIGS",
            Self::AlterConfigs => "ALTER_CONFIGS",
            Self::IdempotentWrite => "IDEMPOTENT_WRITE",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::EVERY
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(name))
    }

    /// The operations whose ALLOW also allows this one (itself included; ALL is handled
    /// apart because it allows everything).
    fn allowed_by(self) -> &'static [Operation] {
        match self {
            Self::Describe => &[
                Self::Describe,
                Self::Read,
                Self::Write,
                Self::Delete,
                Self::Alter,
            ],
            Self::DescribeConfigs => &[Self::DescribeConfigs, Self::AlterConfigs],
            Self::All => &[Self::All],
            Self::Read => &[Self::Read],
            Self::Write => &[Self::Write],
            Self::Create => &[Self::Create],
            Self::Delete => &[Self::Delete],
            Self::Alter => &[Self::Alter],
            Self::ClusterAction => &[Self::ClusterAction],
            Self::AlterConfigs => &[Self::AlterConfigs],
            Self::IdempotentWrite => &[Self::IdempotentWrite],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Self::Deny => 2,
            Self::Allow => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            2 => Some(Self::Deny),
            3 => Some(Self::Allow),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Deny => "DENY",
            Self::Allow => "ALLOW",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Deny, Self::Allow]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }
}

/// What a binding applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourcePattern {
    pub resource_type: ResourceType,
    pub pattern_type: PatternType,
    pub name: String,
}

impl ResourcePattern {
    /// Whether this pattern covers the resource `name` (of the same type).
    fn covers(&self, name: &str) -> bool {
        match self.pattern_type {
            PatternType::Literal => self.name == name || self.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&self.name),
        }
    }
}

/// Who, from where, may or may not do what.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessEntry {
    /// `User:alice`, or `User:*` for every user.
    pub principal: String,
    /// An IP address as the broker prints it, or `*`.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AccessEntry {
    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == WILDCARD_PRINCIPAL)
            && (self.host == host || self.host == WILDCARD)
    }
}

/// The principal every user matches.
pub const WILDCARD_PRINCIPAL: &str = "User:*";

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    pub pattern: ResourcePattern,
    pub entry: AccessEntry,
}

impl fmt::Display for AclBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} on {}:{}:{}",
            self.entry.permission.name(),
            self.entry.principal,
            self.entry.operation.name(),
            self.entry.host,
            self.pattern.resource_type.name(),
            self.pattern.pattern_type.name(),
            self.pattern.name
        )
    }
}

/// Why a binding cannot be created (answered INVALID_REQUEST, per binding, as Kafka does).
pub fn validate(binding: &AclBinding) -> Result<(), String> {
    let p = &binding.pattern;
    if p.name.is_empty() {
        return Err("Resource name should not be empty".into());
    }
    if p.resource_type == ResourceType::Cluster && p.name != CLUSTER_NAME {
        return Err(format!(
            "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        ));
    }
    let principal = &binding.entry.principal;
    match principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
        _ => return Err(format!("Could not parse principal from `{principal}`")),
    }
    let host = &binding.entry.host;
    if host != WILDCARD && host.parse::<std::net::IpAddr>().is_err() {
        return Err(format!("Invalid host `{host}`: `*` or an IP address"));
    }
    Ok(())
}

/// A Describe/Delete filter's resource pattern type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternFilter {
    /// Any pattern type, the name compared exactly.
    Any,
    /// Every binding that applies to the named resource: its literal name, the wildcard, and
    /// the prefixes of the name.
    Match,
    Exactly(PatternType),
}

/// Kafka's AclBindingFilter: None is "any".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    /// The filter that matches every binding.
    pub fn any() -> Self {
        Self {
            resource_type: None,
            name: None,
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        }
    }

    fn matches_pattern(&self, pattern: &ResourcePattern) -> bool {
        if self
            .resource_type
            .is_some_and(|t| t != pattern.resource_type)
        {
            return false;
        }
        match (self.pattern, &self.name) {
            (PatternFilter::Exactly(t), _) if t != pattern.pattern_type => false,
            (_, None) => true,
            (PatternFilter::Match, Some(name)) => pattern.covers(name),
            (PatternFilter::Any | PatternFilter::Exactly(_), Some(name)) => pattern.name == *name,
        }
    }

    fn matches_entry(&self, entry: &AccessEntry) -> bool {
        self.principal
            .as_ref()
            .is_none_or(|p| *p == entry.principal)
            && self.host.as_ref().is_none_or(|h| *h == entry.host)
            && self.operation.is_none_or(|o| o == entry.operation)
            && self.permission.is_none_or(|p| p == entry.permission)
    }

    pub fn matches(&self, binding: &AclBinding) -> bool {
        self.matches_pattern(&binding.pattern) && self.matches_entry(&binding.entry)
    }

    /// Whether a binding on `pattern` with `entry` matches (for filtering a stored object's
    /// entries without building bindings).
    pub fn matches_parts(&self, pattern: &ResourcePattern, entry: &AccessEntry) -> bool {
        self.matches_pattern(pattern) && self.matches_entry(entry)
    }

    /// Whether a binding on `pattern` could match at all (to skip whole objects).
    pub fn may_match_pattern(&self, pattern: &ResourcePattern) -> bool {
        self.matches_pattern(pattern)
    }
}

/// How the authorizer decides besides the bindings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// Principals (`User:admin`) allowed everything.
    pub super_users: Vec<String>,
    /// Allow an operation on a resource no binding applies to.
    pub allow_everyone_if_no_acl_found: bool,
}

/// Every binding of the cluster at one moment, indexed for the checks.
#[derive(Debug, Default, Clone)]
pub struct AclSnapshot {
    literal: HashMap<(ResourceType, String), Vec<AccessEntry>>,
    prefixed: HashMap<ResourceType, Vec<(String, Vec<AccessEntry>)>>,
}

impl AclSnapshot {
    pub fn new(bindings: impl IntoIterator<Item = AclBinding>) -> Self {
        let mut snapshot = Self::default();
        let mut prefixed: HashMap<(ResourceType, String), Vec<AccessEntry>> = HashMap::new();
        for AclBinding { pattern, entry } in bindings {
            let slot = match pattern.pattern_type {
                PatternType::Literal => snapshot
                    .literal
                    .entry((pattern.resource_type, pattern.name))
                    .or_default(),
                PatternType::Prefixed => prefixed
                    .entry((pattern.resource_type, pattern.name))
                    .or_default(),
            };
            if !slot.contains(&entry) {
                slot.push(entry);
            }
        }
        for ((resource_type, name), entries) in prefixed {
            snapshot
                .prefixed
                .entry(resource_type)
                .or_default()
                .push((name, entries));
        }
        snapshot
    }

    pub fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.prefixed.is_empty()
    }

    /// Every binding, in a stable order.
    pub fn bindings(&self) -> Vec<AclBinding> {
        let literal = self.literal.iter().flat_map(|((t, name), entries)| {
            entries.iter().map(|entry| AclBinding {
                pattern: ResourcePattern {
                    resource_type: *t,
                    pattern_type: PatternType::Literal,
                    name: name.clone(),
                },
                entry: entry.clone(),
            })
        });
        let prefixed = self.prefixed.iter().flat_map(|(t, patterns)| {
            patterns.iter().flat_map(|(name, entries)| {
                entries.iter().map(|entry| AclBinding {
                    pattern: ResourcePattern {
                        resource_type: *t,
                        pattern_type: PatternType::Prefixed,
                        name: name.clone(),
                    },
                    entry: entry.clone(),
                })
            })
        });
        let mut all: Vec<AclBinding> = literal.chain(prefixed).collect();
        all.sort();
        all
    }

    /// The entries of every binding that applies to (`resource_type`, `name`).
    fn entries_for<'a>(
        &'a self,
        resource_type: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a AccessEntry> + 'a {
        let exact = self
            .literal
            .get(&(resource_type, name.to_string()))
            .into_iter()
            .flatten();
        let wildcard = if name == WILDCARD {
            None
        } else {
            self.literal.get(&(resource_type, WILDCARD.to_string()))
        }
        .into_iter()
        .flatten();
        let prefixed = self
            .prefixed
            .get(&resource_type)
            .into_iter()
            .flatten()
            .filter(move |(prefix, _)| name.starts_with(prefix.as_str()))
            .flat_map(|(_, entries)| entries.iter());
        exact.chain(wildcard).chain(prefixed)
    }

    /// Kafka's decision for `principal` (`User:alice`) connecting from `host` (the peer's IP
    /// as text) doing `operation` on the resource.
    pub fn authorize(
        &self,
        config: &AuthorizerConfig,
        principal: &str,
        host: &str,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        if config.super_users.iter().any(|s| s == principal) {
            return true;
        }
        let mut any = false;
        let mut allowed = false;
        for entry in self.entries_for(resource_type, name) {
            any = true;
            if !entry.applies_to(principal, host) {
                continue;
            }
            match entry.permission {
                Permission::Deny => {
                    if entry.operation == operation || entry.operation == Operation::All {
                        return false;
                    }
                }
                Permission::Allow => {
                    if entry.operation == Operation::All
                        || operation.allowed_by().contains(&entry.operation)
                    {
                        allowed = true;
                    }
                }
            }
        }
        if !any {
            return config.allow_everyone_if_no_acl_found;
        }
        allowed
    }

    /// Whether `principal` may do `operation` on at least one resource of `resource_type`
    /// (Kafka's `authorizeByResourceType`, which lets WRITE on any topic stand for
    /// IDEMPOTENT_WRITE on the cluster): some ALLOW applies that no DENY of the same
    /// principal covers entirely (a literal wildcard, or a prefix of the allowed pattern).
    pub fn authorize_any(
        &self,
        config: &AuthorizerConfig,
        principal: &str,
        host: &str,
        operation: Operation,
        resource_type: ResourceType,
    ) -> bool {
        if config.super_users.iter().any(|s| s == principal) {
            return true;
        }
        let mut patterns: Vec<(PatternType, &str, &[AccessEntry])> = self
            .literal
            .iter()
            .filter(|((t, _), _)| *t == resource_type)
            .map(|((_, name), e)| (PatternType::Literal, name.as_str(), e.as_slice()))
            .collect();
        if let Some(prefixed) = self.prefixed.get(&resource_type) {
            patterns.extend(
                prefixed
                    .iter()
                    .map(|(name, e)| (PatternType::Prefixed, name.as_str(), e.as_slice())),
            );
        }
        if patterns.is_empty() {
            return config.allow_everyone_if_no_acl_found;
        }
        let denies = |entry: &AccessEntry| {
            entry.permission == Permission::Deny
                && entry.applies_to(principal, host)
                && (entry.operation == operation || entry.operation == Operation::All)
        };
        // DENY patterns that take away everything under them.
        let denied_prefixes: Vec<(PatternType, &str)> = patterns
            .iter()
            .filter(|(_, _, entries)| entries.iter().any(denies))
            .map(|(t, name, _)| (*t, *name))
            .collect();
        let shadowed = |t: PatternType, name: &str| {
            denied_prefixes.iter().any(|(dt, dname)| match dt {
                PatternType::Literal => *dname == WILDCARD || (*dname == name && t == *dt),
                PatternType::Prefixed => name.starts_with(dname),
            })
        };
        patterns.iter().any(|(t, name, entries)| {
            entries.iter().any(|entry| {
                entry.permission == Permission::Allow
                    && entry.applies_to(principal, host)
                    && (entry.operation == Operation::All
                        || operation.allowed_by().contains(&entry.operation))
            }) && !shadowed(*t, name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(
        resource_type: ResourceType,
        pattern_type: PatternType,
        name: &str,
        principal: &str,
        host: &str,
        operation: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            pattern: ResourcePattern {
                resource_type,
                pattern_type,
                name: name.into(),
            },
            entry: AccessEntry {
                principal: principal.into(),
                host: host.into(),
                operation,
                permission,
            },
        }
    }

    fn allow(name: &str, principal: &str, operation: Operation) -> AclBinding {
        binding(
            ResourceType::Topic,
            PatternType::Literal,
            name,
            principal,
            "*",
            operation,
            Permission::Allow,
        )
    }

    fn deny(name: &str, principal: &str, operation: Operation) -> AclBinding {
        AclBinding {
            entry: AccessEntry {
                permission: Permission::Deny,
                ..allow(name, principal, operation).entry
            },
            ..allow(name, principal, operation)
        }
    }

    fn strict() -> AuthorizerConfig {
        AuthorizerConfig::default()
    }

    fn topic(s: &AclSnapshot, principal: &str, operation: Operation, name: &str) -> bool {
        s.authorize(
            &strict(),
            principal,
            "10.0.0.1",
            operation,
            ResourceType::Topic,
            name,
        )
    }

    #[test]
    fn deny_wins_over_allow() {
        let s = AclSnapshot::new([
            allow("orders", "User:alice", Operation::Write),
            deny("orders", "User:alice", Operation::Write),
        ]);
        assert!(!topic(&s, "User:alice", Operation::Write, "orders"));
        // A DENY of ALL (even through the wildcard principal) takes away every operation.
        let s = AclSnapshot::new([
            allow("orders", "User:alice", Operation::All),
            deny("orders", "User:*", Operation::All),
        ]);
        assert!(!topic(&s, "User:alice", Operation::Read, "orders"));
    }

    #[test]
    fn all_allows_every_operation_and_describe_is_implied_by_four() {
        let s = AclSnapshot::new([allow("t", "User:alice", Operation::All)]);
        for op in Operation::EVERY {
            assert!(topic(&s, "User:alice", op, "t"), "{op:?}");
        }
        for op in [
            Operation::Read,
            Operation::Write,
            Operation::Delete,
            Operation::Alter,
        ] {
            let s = AclSnapshot::new([allow("t", "User:bob", op)]);
            assert!(topic(&s, "User:bob", Operation::Describe, "t"), "{op:?}");
            assert!(!topic(&s, "User:bob", Operation::Create, "t"), "{op:?}");
        }
        let s = AclSnapshot::new([allow("t", "User:bob", Operation::Create)]);
        assert!(!topic(&s, "User:bob", Operation::Describe, "t"));
        // Implication goes one way only.
        let s = AclSnapshot::new([allow("t", "User:bob", Operation::Describe)]);
        assert!(!topic(&s, "User:bob", Operation::Read, "t"));
        let s = AclSnapshot::new([allow("t", "User:bob", Operation::AlterConfigs)]);
        assert!(topic(&s, "User:bob", Operation::DescribeConfigs, "t"));
        assert!(!topic(&s, "User:bob", Operation::Describe, "t"));
    }

    #[test]
    fn an_implied_allow_does_not_survive_a_deny_of_describe() {
        let s = AclSnapshot::new([
            allow("t", "User:bob", Operation::Read),
            deny("t", "User:bob", Operation::Describe),
        ]);
        assert!(!topic(&s, "User:bob", Operation::Describe, "t"));
        // But a DENY of READ does not take away DESCRIBE allowed by WRITE.
        let s = AclSnapshot::new([
            allow("t", "User:bob", Operation::Write),
            deny("t", "User:bob", Operation::Read),
        ]);
        assert!(topic(&s, "User:bob", Operation::Describe, "t"));
    }

    #[test]
    fn prefixed_and_wildcard_patterns_match_as_kafka_does() {
        let s = AclSnapshot::new([binding(
            ResourceType::Group,
            PatternType::Prefixed,
            "app-",
            "User:alice",
            "*",
            Operation::Read,
            Permission::Allow,
        )]);
        let group = |name: &str| {
            s.authorize(
                &strict(),
                "User:alice",
                "1.2.3.4",
                Operation::Read,
                ResourceType::Group,
                name,
            )
        };
        assert!(group("app-1"));
        assert!(group("app-"));
        assert!(!group("other"));
        assert!(!group("ap"));
        // Not the same resource type.
        assert!(!topic(&s, "User:alice", Operation::Read, "app-1"));

        let s = AclSnapshot::new([allow("*", "User:*", Operation::Read)]);
        assert!(topic(&s, "User:anyone", Operation::Read, "whatever"));
        assert!(!topic(&s, "User:anyone", Operation::Write, "whatever"));
        // A literal `*` is the wildcard only in a literal pattern.
        let s = AclSnapshot::new([binding(
            ResourceType::Topic,
            PatternType::Prefixed,
            "*",
            "User:*",
            "*",
            Operation::Read,
            Permission::Allow,
        )]);
        assert!(!topic(&s, "User:anyone", Operation::Read, "whatever"));
    }

    #[test]
    fn principal_and_host_must_match() {
        let s = AclSnapshot::new([binding(
            ResourceType::Topic,
            PatternType::Literal,
            "t",
            "User:alice",
            "10.0.0.1",
            Operation::Read,
            Permission::Allow,
        )]);
        let check = |principal: &str, host: &str| {
            s.authorize(
                &strict(),
                principal,
                host,
                Operation::Read,
                ResourceType::Topic,
                "t",
            )
        };
        assert!(check("User:alice", "10.0.0.1"));
        assert!(!check("User:alice", "10.0.0.2"));
        assert!(!check("User:bob", "10.0.0.1"));
    }

    #[test]
    fn super_users_bypass_and_no_acl_follows_the_setting() {
        let s = AclSnapshot::new([deny("t", "User:*", Operation::All)]);
        let config = AuthorizerConfig {
            super_users: vec!["User:admin".into(), "User:ops".into()],
            allow_everyone_if_no_acl_found: false,
        };
        for principal in ["User:admin", "User:ops"] {
            assert!(s.authorize(
                &config,
                principal,
                "1.1.1.1",
                Operation::Delete,
                ResourceType::Topic,
                "t"
            ));
        }
        assert!(!s.authorize(
            &config,
            "User:alice",
            "1.1.1.1",
            Operation::Read,
            ResourceType::Topic,
            "t"
        ));
        // A resource with no binding at all: the setting decides.
        assert!(!s.authorize(
            &config,
            "User:alice",
            "1.1.1.1",
            Operation::Read,
            ResourceType::Topic,
            "u"
        ));
        let open = AuthorizerConfig {
            allow_everyone_if_no_acl_found: true,
            ..config
        };
        assert!(s.authorize(
            &open,
            "User:alice",
            "1.1.1.1",
            Operation::Read,
            ResourceType::Topic,
            "u"
        ));
        // A binding for someone else still counts as an ACL on the resource.
        let s = AclSnapshot::new([allow("u", "User:bob", Operation::Read)]);
        assert!(!s.authorize(
            &open,
            "User:alice",
            "1.1.1.1",
            Operation::Read,
            ResourceType::Topic,
            "u"
        ));
    }

    #[test]
    fn write_on_any_topic_stands_for_idempotent_write_unless_denied_everywhere() {
        let s = AclSnapshot::new([allow("orders", "User:alice", Operation::Write)]);
        let any = |s: &AclSnapshot, principal: &str| {
            s.authorize_any(
                &strict(),
                principal,
                "1.1.1.1",
                Operation::Write,
                ResourceType::Topic,
            )
        };
        assert!(any(&s, "User:alice"));
        assert!(!any(&s, "User:bob"));
        let s = AclSnapshot::new([
            allow("orders", "User:alice", Operation::Write),
            deny("*", "User:alice", Operation::Write),
        ]);
        assert!(!any(&s, "User:alice"));
        let s = AclSnapshot::new([
            allow("orders", "User:alice", Operation::Write),
            binding(
                ResourceType::Topic,
                PatternType::Prefixed,
                "ord",
                "User:alice",
                "*",
                Operation::Write,
                Permission::Deny,
            ),
        ]);
        assert!(!any(&s, "User:alice"));
    }

    #[test]
    fn filters_follow_kafkas_semantics() {
        let literal = allow("orders", "User:alice", Operation::Read);
        let wildcard = allow("*", "User:bob", Operation::Write);
        let prefixed = binding(
            ResourceType::Topic,
            PatternType::Prefixed,
            "ord",
            "User:alice",
            "*",
            Operation::Read,
            Permission::Deny,
        );
        let other_prefix = binding(
            ResourceType::Topic,
            PatternType::Prefixed,
            "x",
            "User:alice",
            "*",
            Operation::Read,
            Permission::Allow,
        );
        let group = binding(
            ResourceType::Group,
            PatternType::Literal,
            "orders",
            "User:alice",
            "*",
            Operation::Read,
            Permission::Allow,
        );
        let all = [&literal, &wildcard, &prefixed, &other_prefix, &group];
        let matching = |f: &AclFilter| -> Vec<&AclBinding> {
            all.iter().copied().filter(|b| f.matches(b)).collect()
        };
        assert_eq!(matching(&AclFilter::any()).len(), 5);
        let named = |pattern| AclFilter {
            resource_type: Some(ResourceType::Topic),
            name: Some("orders".into()),
            pattern,
            ..AclFilter::any()
        };
        assert_eq!(matching(&named(PatternFilter::Any)), vec![&literal]);
        assert_eq!(
            matching(&named(PatternFilter::Match)),
            vec![&literal, &wildcard, &prefixed]
        );
        assert_eq!(
            matching(&named(PatternFilter::Exactly(PatternType::Literal))),
            vec![&literal]
        );
        assert!(matching(&named(PatternFilter::Exactly(PatternType::Prefixed))).is_empty());
        let prefixed_only = AclFilter {
            pattern: PatternFilter::Exactly(PatternType::Prefixed),
            ..AclFilter::any()
        };
        assert_eq!(matching(&prefixed_only), vec![&prefixed, &other_prefix]);
        let by_entry = AclFilter {
            principal: Some("User:alice".into()),
            permission: Some(Permission::Allow),
            operation: Some(Operation::Read),
            host: Some("*".into()),
            ..AclFilter::any()
        };
        assert_eq!(matching(&by_entry), vec![&literal, &other_prefix, &group]);
    }

    #[test]
    fn bindings_kafka_refuses_are_refused() {
        let ok = allow("t", "User:alice", Operation::Read);
        assert!(validate(&ok).is_ok());
        let mut bad = ok.clone();
        bad.pattern.name.clear();
        assert!(validate(&bad).is_err());
        let mut bad = ok.clone();
        bad.entry.principal = "alice".into();
        assert!(validate(&bad).is_err());
        let mut bad = ok.clone();
        bad.entry.host = "not-an-ip".into();
        assert!(validate(&bad).is_err());
        let mut cluster = ok.clone();
        cluster.pattern.resource_type = ResourceType::Cluster;
        assert!(validate(&cluster).is_err());
        cluster.pattern.name = CLUSTER_NAME.into();
        assert!(validate(&cluster).is_ok());
    }

    #[test]
    fn snapshot_lists_its_bindings_once() {
        let a = allow("t", "User:alice", Operation::Read);
        let s = AclSnapshot::new([a.clone(), a.clone()]);
        assert_eq!(s.bindings(), vec![a]);
    }
}
