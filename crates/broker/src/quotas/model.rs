//! Kafka's client-quota entity model (KIP-55, KIP-546): which quota applies to a connection's
//! (user, client id), and which entities a DescribeClientQuotas filter matches. Pure logic.

use std::collections::{BTreeMap, HashMap};

use strata_layout::quotas::{StoredEntityPart, StoredQuota};

/// Entity type names as Kafka spells them.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
/// Kafka's third entity type, for connection-rate quotas, which Strata does not enforce.
pub const IP: &str = "ip";

/// The quota keys Strata enforces, by Kafka name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaKind {
    /// `producer_byte_rate`: bytes of Produce requests per second.
    Produce,
    /// `consumer_byte_rate`: bytes of Fetch responses per second.
    Fetch,
    /// `request_percentage`: time handling requests, in percent of one second per second.
    Request,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 3] = [Self::Produce, Self::Fetch, Self::Request];

    pub fn key(self) -> &'static str {
        match self {
            Self::Produce => "producer_byte_rate",
            Self::Fetch => "consumer_byte_rate",
            Self::Request => "request_percentage",
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Produce => "produce",
            Self::Fetch => "fetch",
            Self::Request => "request",
        }
    }

    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }
}

/// One part of an entity's name: a name, or the type's default (`<default>`, a null name on
/// the wire).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Name {
    Default,
    Named(String),
}

impl Name {
    fn from_option(name: Option<String>) -> Self {
        name.map_or(Self::Default, Self::Named)
    }

    fn as_option(&self) -> Option<&str> {
        match self {
            Self::Default => None,
            Self::Named(name) => Some(name),
        }
    }
}

/// A quota entity: a user, a client id, or both. At least one is set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entity {
    pub user: Option<Name>,
    pub client_id: Option<Name>,
}

impl Entity {
    /// The entity's parts as stored and as on the wire: (type, name), sorted by type.
    pub fn parts(&self) -> Vec<(&'static str, Option<&str>)> {
        let mut parts = Vec::with_capacity(2);
        if let Some(client) = &self.client_id {
            parts.push((CLIENT_ID, client.as_option()));
        }
        if let Some(user) = &self.user {
            parts.push((USER, user.as_option()));
        }
        parts
    }

    pub fn to_stored(&self) -> Vec<StoredEntityPart> {
        self.parts()
            .into_iter()
            .map(|(entity_type, name)| StoredEntityPart {
                entity_type: entity_type.to_string(),
                name: name.map(str::to_string),
            })
            .collect()
    }

    /// The entity of (type, name) parts, None unless they are a user, a client id or one of
    /// each.
    pub fn from_parts(
        parts: impl IntoIterator<Item = (String, Option<String>)>,
    ) -> Result<Self, String> {
        let mut entity = Entity {
            user: None,
            client_id: None,
        };
        let mut any = false;
        for (entity_type, name) in parts {
            any = true;
            let slot = match entity_type.as_str() {
                USER => &mut entity.user,
                CLIENT_ID => &mut entity.client_id,
                IP => return Err("ip quotas (connection_creation_rate) are not supported".into()),
                other => return Err(format!("Unhandled client quota entity type: {other}")),
            };
            if slot.is_some() {
                return Err(format!(
                    "Duplicate {entity_type} entity in the quota entity"
                ));
            }
            *slot = Some(Name::from_option(name));
        }
        if !any {
            return Err("Invalid empty client quota entity".into());
        }
        Ok(entity)
    }
}

/// Every quota entity with its values: what storage holds, as one broker last read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuotaTable {
    entries: HashMap<Entity, BTreeMap<QuotaKind, f64>>,
}

/// Whose usage a quota is measured over: the actual user and/or client id, for the parts the
/// entity that supplied the quota names (Kafka's metric tags). A default-user quota is one
/// bucket per user, not one shared by all users.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    pub user: Option<String>,
    pub client_id: Option<String>,
}

impl QuotaTable {
    /// The table of stored objects; objects of entities Strata does not know (an `ip` entity
    /// written by a newer build) and keys it does not enforce are skipped.
    pub fn from_stored(objects: impl IntoIterator<Item = StoredQuota>) -> Self {
        let mut entries = HashMap::new();
        for object in objects {
            let parts = object.entity.into_iter().map(|p| (p.entity_type, p.name));
            let Ok(entity) = Entity::from_parts(parts) else {
                continue;
            };
            let values: BTreeMap<QuotaKind, f64> = object
                .values
                .iter()
                .filter_map(|(k, v)| Some((QuotaKind::from_key(k)?, *v)))
                .collect();
            if !values.is_empty() {
                entries.insert(entity, values);
            }
        }
        Self { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn insert(&mut self, entity: Entity, kind: QuotaKind, value: f64) {
        self.entries.entry(entity).or_default().insert(kind, value);
    }

    /// The `kind` quota of a connection of `user` with `client_id`, and the bucket its usage
    /// is measured in; None if no entity supplies one. Kafka's precedence, first match wins:
    ///
    /// 1. /config/users/<user>/clients/<client-id>
    /// 2. /config/users/<user>/clients/<default>
    /// 3. /config/users/<user>
    /// 4. /config/users/<default>/clients/<client-id>
    /// 5. /config/users/<default>/clients/<default>
    /// 6. /config/users/<default>
    /// 7. /config/clients/<client-id>
    /// 8. /config/clients/<default>
    pub fn resolve(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<(f64, Bucket)> {
        if self.entries.is_empty() {
            return None;
        }
        let named = |s: &str| Some(Name::Named(s.to_string()));
        let default = || Some(Name::Default);
        let order = [
            (named(user), named(client_id)),
            (named(user), default()),
            (named(user), None),
            (default(), named(client_id)),
            (default(), default()),
            (default(), None),
            (None, named(client_id)),
            (None, default()),
        ];
        order.into_iter().find_map(|(u, c)| {
            let bucket = Bucket {
                user: u.is_some().then(|| user.to_string()),
                client_id: c.is_some().then(|| client_id.to_string()),
            };
            let entity = Entity {
                user: u,
                client_id: c,
            };
            let value = *self.entries.get(&entity)?.get(&kind)?;
            Some((value, bucket))
        })
    }

    /// The entities a DescribeClientQuotas filter matches, with their values, sorted.
    pub fn describe(&self, filter: &Filter) -> Vec<(Entity, BTreeMap<QuotaKind, f64>)> {
        let mut found: Vec<_> = self
            .entries
            .iter()
            .filter(|(entity, _)| filter.matches(entity))
            .map(|(e, v)| (e.clone(), v.clone()))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }
}

/// How a filter component matches its entity type (DescribeClientQuotas `match_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// 0: this name.
    Exact(String),
    /// 1: the default.
    Default,
    /// 2: any name, the default included.
    Any,
}

/// A DescribeClientQuotas filter, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub user: Option<Match>,
    pub client_id: Option<Match>,
    /// Only entities with no other part than the filtered types.
    pub strict: bool,
}

impl Filter {
    /// Validates the request's components as Kafka does; the error is an INVALID_REQUEST
    /// message (or, for an unknown entity type, an UNSUPPORTED_VERSION one: the bool).
    pub fn new(
        components: impl IntoIterator<Item = (String, i8, Option<String>)>,
        strict: bool,
    ) -> Result<Self, (bool, String)> {
        let mut filter = Filter {
            strict,
            ..Filter::default()
        };
        let mut ip = false;
        for (entity_type, match_type, name) in components {
            if entity_type.is_empty() {
                return Err((false, "Invalid empty entity type.".into()));
            }
            let matcher = match (match_type, name) {
                (0, Some(name)) => Match::Exact(name),
                (0, None) => {
                    return Err((
                        false,
                        "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                    ))
                }
                (1, None) => Match::Default,
                (2, None) => Match::Any,
                (1 | 2, Some(_)) => {
                    return Err((
                        false,
                        format!(
                            "Request specified match type {match_type}, but also specified a match string."
                        ),
                    ))
                }
                (other, _) => return Err((false, format!("Unknown match type {other}"))),
            };
            let slot = match entity_type.as_str() {
                USER => &mut filter.user,
                CLIENT_ID => &mut filter.client_id,
                IP => {
                    ip = true;
                    continue;
                }
                other => return Err((true, format!("Unknown entity type {other}"))),
            };
            if slot.is_some() {
                return Err((
                    false,
                    format!(
                        "Entity type {entity_type} cannot appear more than once in the filter."
                    ),
                ));
            }
            *slot = Some(matcher);
        }
        if ip {
            if filter.user.is_some() || filter.client_id.is_some() {
                return Err((false, "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.".into()));
            }
            // No ip entity is ever stored: an ip filter matches nothing.
            filter.user = Some(Match::Exact(String::new()));
            filter.client_id = Some(Match::Exact(String::new()));
            filter.strict = true;
        }
        Ok(filter)
    }

    pub fn matches(&self, entity: &Entity) -> bool {
        fn one(matcher: &Option<Match>, name: &Option<Name>) -> bool {
            match (matcher, name) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(Match::Any), Some(_)) => true,
                (Some(Match::Default), Some(name)) => *name == Name::Default,
                (Some(Match::Exact(want)), Some(name)) => {
                    matches!(name, Name::Named(n) if n == want)
                }
            }
        }
        if self.strict {
            let parts =
                usize::from(entity.user.is_some()) + usize::from(entity.client_id.is_some());
            let filtered = usize::from(self.user.is_some()) + usize::from(self.client_id.is_some());
            if parts != filtered {
                return false;
            }
        }
        one(&self.user, &entity.user) && one(&self.client_id, &entity.client_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Option<Name> {
        Some(Name::Named(s.into()))
    }
    fn d() -> Option<Name> {
        Some(Name::Default)
    }
    fn e(user: Option<Name>, client_id: Option<Name>) -> Entity {
        Entity { user, client_id }
    }

    #[test]
    fn each_level_of_the_precedence_wins_over_every_level_below_it() {
        // Levels in Kafka's order; adding them from the lowest up, each one must take over.
        let levels = [
            e(None, d()),
            e(None, n("c")),
            e(d(), None),
            e(d(), d()),
            e(d(), n("c")),
            e(n("u"), None),
            e(n("u"), d()),
            e(n("u"), n("c")),
        ];
        let mut table = QuotaTable::default();
        assert_eq!(table.resolve(QuotaKind::Produce, "u", "c"), None);
        for (i, entity) in levels.iter().enumerate() {
            table.insert(entity.clone(), QuotaKind::Produce, i as f64 + 1.0);
            let (value, bucket) = table.resolve(QuotaKind::Produce, "u", "c").unwrap();
            assert_eq!(value, i as f64 + 1.0, "level {entity:?}");
            assert_eq!(bucket.user.is_some(), entity.user.is_some());
            assert_eq!(bucket.client_id.is_some(), entity.client_id.is_some());
        }
        // Another user and client fall through to the defaults, in their own bucket.
        let (value, bucket) = table.resolve(QuotaKind::Produce, "v", "x").unwrap();
        assert_eq!(value, 4.0);
        assert_eq!(
            bucket,
            Bucket {
                user: Some("v".into()),
                client_id: Some("x".into())
            }
        );
        // Each key resolves on its own.
        assert_eq!(table.resolve(QuotaKind::Fetch, "u", "c"), None);
        table.insert(e(None, d()), QuotaKind::Fetch, 9.0);
        assert_eq!(table.resolve(QuotaKind::Fetch, "u", "c").unwrap().0, 9.0);
    }

    #[test]
    fn a_user_named_like_the_default_is_not_the_default() {
        let mut table = QuotaTable::default();
        table.insert(e(n("<default>"), None), QuotaKind::Produce, 1.0);
        assert_eq!(table.resolve(QuotaKind::Produce, "alice", ""), None);
        assert_eq!(
            table
                .resolve(QuotaKind::Produce, "<default>", "")
                .unwrap()
                .0,
            1.0
        );
    }

    fn filter(components: &[(&str, i8, Option<&str>)], strict: bool) -> Filter {
        Filter::new(
            components
                .iter()
                .map(|(t, m, s)| (t.to_string(), *m, s.map(str::to_string))),
            strict,
        )
        .unwrap()
    }

    #[test]
    fn filters_match_exact_default_and_any_names_strictly_or_not() {
        let mut table = QuotaTable::default();
        for entity in [
            e(n("u"), None),
            e(d(), None),
            e(n("u"), n("c")),
            e(None, n("c")),
            e(None, d()),
        ] {
            table.insert(entity, QuotaKind::Produce, 1.0);
        }
        let got =
            |f: Filter| -> Vec<Entity> { table.describe(&f).into_iter().map(|(e, _)| e).collect() };
        let mut want = vec![e(n("u"), None), e(n("u"), n("c"))];
        want.sort();
        assert_eq!(got(filter(&[("user", 0, Some("u"))], false)), want);
        assert_eq!(
            got(filter(&[("user", 0, Some("u"))], true)),
            [e(n("u"), None)]
        );
        assert_eq!(got(filter(&[("user", 1, None)], false)), [e(d(), None)]);
        assert_eq!(got(filter(&[("user", 2, None)], true)).len(), 2);
        assert_eq!(got(filter(&[("user", 2, None)], false)).len(), 3);
        assert_eq!(
            got(filter(
                &[("user", 2, None), ("client-id", 0, Some("c"))],
                true
            )),
            [e(n("u"), n("c"))]
        );
        assert_eq!(got(filter(&[], false)).len(), 5);
        assert!(got(filter(&[], true)).is_empty());
        assert!(got(filter(&[("ip", 2, None)], false)).is_empty());
    }

    #[test]
    fn malformed_filters_are_refused_as_kafka_refuses_them() {
        let bad = |components: &[(&str, i8, Option<&str>)]| {
            Filter::new(
                components
                    .iter()
                    .map(|(t, m, s)| (t.to_string(), *m, s.map(str::to_string))),
                false,
            )
            .unwrap_err()
        };
        assert!(!bad(&[("user", 0, None)]).0);
        assert!(!bad(&[("user", 1, Some("x"))]).0);
        assert!(!bad(&[("user", 2, Some("x"))]).0);
        assert!(!bad(&[("user", 7, None)]).0);
        assert!(!bad(&[("", 2, None)]).0);
        assert!(!bad(&[("user", 2, None), ("user", 1, None)]).0);
        assert!(!bad(&[("user", 2, None), ("ip", 1, None)]).0);
        assert!(
            bad(&[("group", 2, None)]).0,
            "unknown type: UNSUPPORTED_VERSION"
        );
    }

    #[test]
    fn entities_are_a_user_a_client_id_or_both() {
        let parts = |p: &[(&str, Option<&str>)]| {
            Entity::from_parts(
                p.iter()
                    .map(|(t, n)| (t.to_string(), n.map(str::to_string))),
            )
        };
        assert_eq!(
            parts(&[("user", Some("u")), ("client-id", None)]).unwrap(),
            e(n("u"), d())
        );
        assert!(parts(&[]).is_err());
        assert!(parts(&[("user", None), ("user", Some("u"))]).is_err());
        assert!(parts(&[("ip", None)]).is_err());
        assert!(parts(&[("topic", None)]).is_err());
    }
}
