//! Removing what a test stored on a shared storage service once it is done with it.
//!
//! Local directories go with their temporary directory. A RADOS namespace does not, and it
//! costs more than space: RADOS lists a namespace by scanning every object of the pool, so
//! each test's leftovers made every later broker's listings slower (measured on the one-OSD
//! test cluster: 60–80 ms per listing with 35k objects left in other namespaces, enough to
//! starve heartbeats in a three-broker test). S3 prefixes list through the bucket index and
//! are left to the bucket's lifetime.
//!
//! The `rados` command-line tool (installed with Ceph) does the work, since this crate must not
//! link the broker's storage code. A failing test keeps its objects, for inspection.

use std::process::Command;

/// How many object names one `rados rm` gets.
const REMOVE_BATCH: usize = 1000;

/// Deletes every object of the RADOS namespace `url` names (`rados://pool/namespace?conf=..
/// &user=..`); any other URL is left alone. Best effort: a failure is printed, not raised.
pub fn remove_test_objects(url: &str) {
    let Some(target) = RadosTarget::parse(url) else {
        return;
    };
    if std::thread::panicking() {
        eprintln!(
            "keeping RADOS namespace {} for inspection",
            target.namespace
        );
        return;
    }
    let listed = match target.command(&["ls"]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            eprintln!(
                "rados ls of namespace {} failed: {}",
                target.namespace,
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        Err(e) => {
            eprintln!(
                "cannot run rados to clean up namespace {}: {e}",
                target.namespace
            );
            return;
        }
    };
    let names: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
    for batch in names.chunks(REMOVE_BATCH) {
        let mut args = vec!["rm"];
        args.extend_from_slice(batch);
        match target.command(&args).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "rados rm in namespace {} failed: {}",
                target.namespace,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run rados rm: {e}"),
        }
    }
}

struct RadosTarget {
    pool: String,
    namespace: String,
    conf: Option<String>,
    user: Option<String>,
}

impl RadosTarget {
    /// Only a URL with a namespace: the default namespace may hold more than one test's data.
    fn parse(url: &str) -> Option<Self> {
        let rest = url.strip_prefix("rados://")?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (pool, namespace) = path.split_once('/')?;
        let namespace = namespace.trim_matches('/');
        if pool.is_empty() || namespace.is_empty() {
            return None;
        }
        let mut target = Self {
            pool: pool.to_string(),
            namespace: namespace.to_string(),
            conf: None,
            user: None,
        };
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("conf", value)) => target.conf = Some(value.to_string()),
                Some(("user", value)) => target.user = Some(value.to_string()),
                _ => {}
            }
        }
        Some(target)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("rados");
        if let Some(conf) = &self.conf {
            command.args(["-c", conf]);
        }
        if let Some(user) = &self.user {
            command.args(["--id", user.strip_prefix("client.").unwrap_or(user)]);
        }
        command.args(["-p", &self.pool, "-N", &self.namespace]);
        command.args(args);
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rados_urls_with_a_namespace_are_targets() {
        let target =
            RadosTarget::parse("rados://strata/run7?conf=/tmp/c/ceph.conf&user=admin").unwrap();
        assert_eq!(
            (target.pool.as_str(), target.namespace.as_str()),
            ("strata", "run7")
        );
        assert_eq!(target.conf.as_deref(), Some("/tmp/c/ceph.conf"));
        assert_eq!(target.user.as_deref(), Some("admin"));
        assert!(RadosTarget::parse("rados://strata").is_none());
        assert!(RadosTarget::parse("rados://strata/?conf=x").is_none());
        assert!(RadosTarget::parse("s3://bucket/prefix").is_none());
        assert!(RadosTarget::parse("file:///tmp/x").is_none());
    }
}
