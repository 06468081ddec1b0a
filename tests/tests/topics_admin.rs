//! Topic administration with Python's confluent-kafka AdminClient (tests/python/topics_admin.py)
//! against three real brokers: replication factor 3, an explicit replica assignment, a
//! preferred leader election after a move, and topic configs. Fails, rather than skips, when
//! confluent-kafka is missing: `.ci/run` installs it.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use strata_tests::cluster::Cluster;
use strata_tests::command::run_with_deadline;

const CLIENT_DEADLINE: Duration = Duration::from_secs(90);

fn admin_phase(cluster: &Cluster, phase: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/topics_admin.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(cluster.bootstrap_of(&cluster.all_ids()))
        .arg(phase);
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE);
    finished.assert_success(&format!("tests/python/topics_admin.py {phase}"));
    eprintln!("{phase}: {}", finished.stdout);
}

#[test]
fn admin_client_creates_rf3_and_assigned_topics_elects_preferred_leaders_and_alters_configs() {
    let cluster = Cluster::start(3, "3s", "500ms");
    assert_eq!(cluster.all_ids(), vec![1, 2, 3]);
    admin_phase(&cluster, "create");
    // Moved away from its preferred replica (an operator's override, as a reassignment is)...
    cluster.move_partition("pinned", 0, 3);
    cluster.wait_for_leaders(1, "pinned", 1, &[3], "broker 3 leads pinned after the move");
    // ...and back by a preferred election.
    admin_phase(&cluster, "elect");
    admin_phase(&cluster, "configs");
}
