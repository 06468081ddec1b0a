use strata_storage::{StorageError, StorageResult};

/// librados settings this backend sets unless the URL does: without them a dead cluster would
/// block a connect for 300 s (`client_mount_timeout`) and an operation forever (the op timeouts
/// default to 0 = none), pinning a blocking thread each.
pub const DEFAULT_CEPH_OPTIONS: [(&str, &str); 3] = [
    ("client_mount_timeout", "10"),
    ("rados_osd_op_timeout", "30"),
    ("rados_mon_op_timeout", "30"),
];

/// How many librados calls run at once per store unless `max_in_flight` says otherwise. Each
/// holds one thread of tokio's blocking pool for the operation's duration.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// What a `rados://` URL says, parsed and checked before anything connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadosConfig {
    /// The pool; it must exist (scripts/ceph-up.sh creates `strata`).
    pub pool: String,
    /// RADOS namespace inside the pool; empty is the default namespace.
    pub namespace: String,
    /// ceph.conf to read; `None` lets librados search its default places (and `CEPH_CONF`).
    pub conf: Option<String>,
    /// Client id without the `client.` prefix (`admin`).
    pub user: String,
    /// Keyring file, when not the one ceph.conf names.
    pub keyring: Option<String>,
    /// Concurrent librados calls.
    pub max_in_flight: usize,
    /// Other librados options (`rados_osd_op_timeout=5`, ...), set before connecting; they
    /// override [`DEFAULT_CEPH_OPTIONS`].
    pub ceph_options: Vec<(String, String)>,
}

impl RadosConfig {
    /// Parses `rados://POOL[/NAMESPACE]?conf=/etc/ceph/ceph.conf&user=admin[&keyring=PATH]
    /// [&max_in_flight=N][&<librados option>=VALUE...]`.
    pub fn from_url(url: &str) -> StorageResult<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|err| StorageError::Invalid(format!("bad RADOS URL {url:?}: {err}")))?;
        if parsed.scheme() != "rados" {
            return Err(StorageError::Invalid(format!(
                "RADOS URL must start with rados://, got {url:?}"
            )));
        }
        let pool = parsed
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| StorageError::Invalid(format!("RADOS URL {url:?} names no pool")))?
            .to_string();
        let namespace = parsed.path().trim_matches('/').to_string();
        if namespace.contains('/') {
            return Err(StorageError::Invalid(format!(
                "RADOS namespace {namespace:?} in {url:?} may not contain '/'"
            )));
        }
        let mut config = Self {
            pool,
            namespace,
            conf: None,
            user: "admin".to_string(),
            keyring: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            ceph_options: Vec::new(),
        };
        for (name, value) in parsed.query_pairs() {
            let value = value.into_owned();
            match name.as_ref() {
                "conf" => config.conf = Some(value),
                "user" | "id" => {
                    config.user = value.strip_prefix("client.").unwrap_or(&value).to_string()
                }
                "keyring" => config.keyring = Some(value),
                "max_in_flight" => {
                    config.max_in_flight =
                        value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            StorageError::Invalid(format!(
                                "max_in_flight must be a positive integer, not {value:?}"
                            ))
                        })?
                }
                other => config.ceph_options.push((other.to_string(), value)),
            }
        }
        if config.user.is_empty() {
            return Err(StorageError::Invalid("RADOS user is empty".to_string()));
        }
        Ok(config)
    }

    /// Every librados option to set before connecting: the defaults, then the URL's.
    pub fn effective_ceph_options(&self) -> Vec<(String, String)> {
        let mut options: Vec<(String, String)> = DEFAULT_CEPH_OPTIONS
            .iter()
            .filter(|(name, _)| !self.ceph_options.iter().any(|(given, _)| given == name))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        options.extend(self.ceph_options.iter().cloned());
        if let Some(keyring) = &self.keyring {
            options.push(("keyring".to_string(), keyring.clone()));
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pool_namespace_and_options() {
        let config = RadosConfig::from_url(
            "rados://strata/run-7?conf=/tmp/c/ceph.conf&user=client.admin&max_in_flight=8\
             &rados_osd_op_timeout=5",
        )
        .unwrap();
        assert_eq!(config.pool, "strata");
        assert_eq!(config.namespace, "run-7");
        assert_eq!(config.conf.as_deref(), Some("/tmp/c/ceph.conf"));
        assert_eq!(config.user, "admin");
        assert_eq!(config.max_in_flight, 8);
        let options = config.effective_ceph_options();
        assert!(options.contains(&("rados_osd_op_timeout".into(), "5".into())));
        assert!(options.contains(&("client_mount_timeout".into(), "10".into())));
        assert!(!options.contains(&("rados_osd_op_timeout".into(), "30".into())));
    }

    #[test]
    fn defaults() {
        let config = RadosConfig::from_url("rados://strata").unwrap();
        assert_eq!(config.namespace, "");
        assert_eq!(config.user, "admin");
        assert_eq!(config.conf, None);
        assert_eq!(config.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
        let with_keyring = RadosConfig::from_url("rados://strata/?keyring=/k").unwrap();
        assert_eq!(with_keyring.namespace, "");
        assert!(with_keyring
            .effective_ceph_options()
            .contains(&("keyring".into(), "/k".into())));
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for bad in [
            "s3://strata",
            "rados:///ns",
            "rados://strata/a/b",
            "rados://strata?max_in_flight=0",
            "rados://strata?user=",
        ] {
            assert!(
                matches!(RadosConfig::from_url(bad), Err(StorageError::Invalid(_))),
                "{bad:?} accepted"
            );
        }
    }
}
