//! Authentication end to end: named listeners (PLAINTEXT, SASL_PLAINTEXT, SASL_SSL), SASL
//! with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN against users kept in the shared storage,
//! driven by Python's confluent-kafka (tests/python/security.py) and by hand-built frames.
//!
//! Test certificates are made at test time with the `openssl` command (`.ci/run` installs it).

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kafka_protocol::messages::{MetadataRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use strata_tests::binary::strata_binary;
use strata_tests::certs::Certificates;
use strata_tests::cluster::Cluster;
use strata_tests::command::{run_with_deadline, Finished};
use strata_tests::raw::RawConnection;
use strata_tests::{SharedStorage, StrataOptions, StrataProcess};

const CLIENT_DEADLINE: Duration = Duration::from_secs(90);
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// The address listener `name` is bound to, from the broker's `listener NAME (...) on ADDR`.
fn listener_addr(broker: &StrataProcess, name: &str) -> SocketAddr {
    let marker = format!("listener {name} (");
    // Logged before the `listening on` line the harness waits for.
    let line = broker
        .log_lines_containing(&marker)
        .pop()
        .unwrap_or_else(|| panic!("the broker logged no {marker}... line"));
    line.split(" on ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|addr| addr.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// `strata users ARGS --storage URL`.
fn users(storage: &str, args: &[&str]) -> Finished {
    let mut command = Command::new(strata_binary());
    command
        .arg("users")
        .args(args)
        .arg("--storage")
        .arg(storage);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    run_with_deadline(command, b"", CLIENT_DEADLINE)
}

fn create_user(storage: &str, user: &str, password: &str, mechanism: &str) {
    users(
        storage,
        &[
            "create",
            "--user",
            user,
            "--password",
            password,
            "--mechanism",
            mechanism,
        ],
    )
    .assert_success(&format!("strata users create --user {user}"));
}

/// tests/python/security.py COMMAND with these arguments.
fn python(command: &str, args: &[&str]) -> Finished {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/security.py");
    let mut python = Command::new("python3");
    python.arg(&script).arg(command).args(args);
    run_with_deadline(python, b"", CLIENT_DEADLINE)
}

/// A broker on `storage` with a PLAINTEXT, a SASL_PLAINTEXT and (with `certs`) a SASL_SSL
/// listener, and a metrics endpoint.
fn secured_broker(storage: &SharedStorage, certs: Option<&Certificates>) -> StrataProcess {
    let mut listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0".to_string();
    let mut args = vec!["--metrics-listen".to_string(), "127.0.0.1:0".to_string()];
    if let Some(certs) = certs {
        listeners.push_str(",SASL_SSL://127.0.0.1:0");
        args.extend([
            "--ssl-certificate".to_string(),
            certs.path("server.pem").display().to_string(),
            "--ssl-key".to_string(),
            certs.path("server.key").display().to_string(),
        ]);
    }
    args.extend(["--listeners".to_string(), listeners]);
    StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(args),
    )
}

fn sasl_args<'a>(
    bootstrap: &'a str,
    protocol: &'a str,
    mechanism: &'a str,
    user: &'a str,
    password: &'a str,
) -> Vec<&'a str> {
    vec![
        "--bootstrap",
        bootstrap,
        "--protocol",
        protocol,
        "--mechanism",
        mechanism,
        "--user",
        user,
        "--password",
        password,
    ]
}

/// The value of `series` (name and labels exactly) on the broker's /metrics.
fn metric(broker: &StrataProcess, series: &str) -> f64 {
    let line = broker
        .log_lines_containing("metrics on ")
        .pop()
        .expect("the broker logged its metrics address");
    let address = line
        .rsplit("metrics on ")
        .next()
        .unwrap()
        .trim()
        .to_string();
    let mut stream = std::net::TcpStream::connect(address).expect("connect to /metrics");
    stream.set_read_timeout(Some(CLOSE_DEADLINE)).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"GET /metrics HTTP/1.1\r\nHost: strata\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).unwrap();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Users made with `strata users create` before the broker starts log in with SCRAM-SHA-512,
/// SCRAM-SHA-256 and PLAIN (checked against the stored SCRAM credential), produce and
/// consume; `strata users list` shows them and a deleted credential no longer logs in.
#[test]
fn users_created_with_the_command_produce_and_consume_over_sasl_plaintext() {
    let storage = SharedStorage::new();
    create_user(storage.url(), "alice", "alice-secret", "SCRAM-SHA-512");
    create_user(storage.url(), "bob", "bob-secret", "SCRAM-SHA-256");
    let broker = secured_broker(&storage, None);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();

    for (mechanism, user, password, topic) in [
        ("SCRAM-SHA-512", "alice", "alice-secret", "scram512"),
        ("SCRAM-SHA-256", "bob", "bob-secret", "scram256"),
        ("PLAIN", "alice", "alice-secret", "plain-alice"),
        ("PLAIN", "bob", "bob-secret", "plain-bob"),
    ] {
        let mut args = sasl_args(&sasl, "SASL_PLAINTEXT", mechanism, user, password);
        args.extend(["--topic", topic]);
        python("round-trip", &args).assert_success(&format!("{mechanism} round trip as {user}"));
    }
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="SCRAM-SHA-512",result="success"}"#
        ) >= 1.0
    );
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="PLAIN",result="success"}"#
        ) >= 1.0
    );

    let listed = users(storage.url(), &["list"]);
    listed.assert_success("strata users list");
    assert!(
        listed.stdout.contains("alice\tSCRAM-SHA-512"),
        "{}",
        listed.stdout
    );
    assert!(
        listed.stdout.contains("bob\tSCRAM-SHA-256"),
        "{}",
        listed.stdout
    );
    assert!(!listed.stdout.contains("secret"), "{}", listed.stdout);

    users(
        storage.url(),
        &["delete", "--user", "bob", "--mechanism", "SCRAM-SHA-256"],
    )
    .assert_success("strata users delete");
    // Seen by the running broker within its user cache's lifetime (1s); the client's own
    // retries are not relied on: each attempt is a fresh client.
    strata_tests::wait::wait_until(
        "bob's deleted credential is refused",
        CLIENT_DEADLINE,
        || {
            python(
                "refused",
                &sasl_args(
                    &sasl,
                    "SASL_PLAINTEXT",
                    "SCRAM-SHA-256",
                    "bob",
                    "bob-secret",
                ),
            )
            .status
            .success()
            .then_some(())
        },
    );
}

/// A wrong password (SCRAM and PLAIN) and a user that does not exist are refused with an
/// authentication error, counted as such; the refusal reads the same for both.
#[test]
fn wrong_passwords_and_unknown_users_are_refused() {
    let storage = SharedStorage::new();
    create_user(storage.url(), "carol", "carol-secret", "SCRAM-SHA-512");
    let broker = secured_broker(&storage, None);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    for (mechanism, user, password) in [
        ("SCRAM-SHA-512", "carol", "wrong"),
        ("PLAIN", "carol", "wrong"),
        ("SCRAM-SHA-512", "nobody", "carol-secret"),
        ("PLAIN", "nobody", "carol-secret"),
        // carol has no SCRAM-SHA-256 credential.
        ("SCRAM-SHA-256", "carol", "carol-secret"),
    ] {
        let refused = python(
            "refused",
            &sasl_args(&sasl, "SASL_PLAINTEXT", mechanism, user, password),
        );
        refused.assert_success(&format!("{mechanism} as {user} with a wrong password"));
        assert!(
            refused.stdout.contains("Invalid username or password"),
            "{}",
            refused.stdout
        );
    }
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="SCRAM-SHA-512",result="bad_credentials"}"#
        ) >= 2.0
    );
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="PLAIN",result="bad_credentials"}"#
        ) >= 2.0
    );
    assert_eq!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="SCRAM-SHA-512",result="success"}"#
        ),
        0.0
    );
}

/// On a SASL listener only ApiVersions and the SASL exchange are served before
/// authentication: any other request closes the connection, and an unknown mechanism is
/// refused with the list of enabled ones, then the connection is closed.
#[test]
fn requests_before_authentication_close_the_connection() {
    let storage = SharedStorage::new();
    let broker = secured_broker(&storage, None);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT");

    let mut raw = RawConnection::connect(sasl);
    let versions = raw.api_versions();
    assert!(
        versions.api_keys.iter().any(|k| k.api_key == 17),
        "SaslHandshake advertised"
    );
    assert!(
        versions.api_keys.iter().any(|k| k.api_key == 36),
        "SaslAuthenticate advertised"
    );
    raw.send(4, &MetadataRequest::default());
    raw.expect_closed("a Metadata request before authentication", CLOSE_DEADLINE);

    let mut raw = RawConnection::connect(sasl);
    let mut handshake = SaslHandshakeRequest::default();
    handshake.mechanism = StrBytes::from_static_str("GSSAPI");
    let response = raw.request(1, &handshake);
    assert_eq!(response.error_code, 33, "UNSUPPORTED_SASL_MECHANISM");
    let offered: Vec<&str> = response.mechanisms.iter().map(|m| m.as_str()).collect();
    assert_eq!(offered, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    raw.expect_closed("an unsupported mechanism", CLOSE_DEADLINE);

    // The PLAINTEXT listener of the same broker still serves without authentication.
    let mut plain = RawConnection::connect(broker.addr());
    let metadata = plain.request(4, &MetadataRequest::default());
    assert_eq!(metadata.brokers.len(), 1);
    assert_eq!(metadata.brokers[0].port, i32::from(broker.addr().port()));
}

/// SASL_SSL: TLS (checked against the test CA, host name included) with SCRAM-SHA-512 and
/// PLAIN; garbage sent to the TLS port closes that connection and nothing else.
#[test]
fn sasl_ssl_with_scram_and_plain_and_garbage_on_the_tls_port() {
    let certs = Certificates::make();
    let storage = SharedStorage::new();
    create_user(storage.url(), "dave", "dave-secret", "SCRAM-SHA-512");
    let broker = secured_broker(&storage, Some(&certs));
    let tls = listener_addr(&broker, "SASL_SSL");

    let mut garbage = RawConnection::connect(tls);
    let _ = garbage.write_raw(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0xff, 0xff]);
    garbage.expect_closed("garbage on the TLS port", CLOSE_DEADLINE);

    let bootstrap = tls.to_string();
    let ca = certs.path("ca.pem").display().to_string();
    for (mechanism, topic) in [("SCRAM-SHA-512", "tls-scram"), ("PLAIN", "tls-plain")] {
        let mut args = sasl_args(&bootstrap, "SASL_SSL", mechanism, "dave", "dave-secret");
        args.extend(["--ca", &ca, "--topic", topic]);
        python("round-trip", &args).assert_success(&format!("SASL_SSL {mechanism} round trip"));
    }
    let mut args = sasl_args(&bootstrap, "SASL_SSL", "SCRAM-SHA-512", "dave", "wrong");
    args.extend(["--ca", &ca]);
    python("refused", &args).assert_success("SASL_SSL with a wrong password");
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="TLS",result="tls_handshake"}"#
        ) >= 1.0
    );
}

/// A user created through the Admin API (AlterUserScramCredentials) on broker 1 logs in on
/// broker 2 of the same cluster: the credential is in the shared storage, not in a broker.
/// Broker 2 tells a client of its SASL listener broker 1's SASL endpoint, from broker 1's
/// registration, and the client produces and consumes through the cluster.
/// Broker 2 tells a client of its SASL listener broker 1's SASL endpoint, from broker 1's
/// registration, and the client produces and consumes through the cluster.
#[test]
fn a_user_created_through_the_admin_api_on_one_broker_logs_in_on_another() {
    let listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0";
    let cluster = Cluster::start_with_env(2, "3s", "500ms", &[("STRATA_LISTENERS", listeners)]);
    create_user(
        cluster.storage.url(),
        "admin",
        "admin-secret",
        "SCRAM-SHA-512",
    );
    let mut cluster = cluster;
    let on_1 = listener_addr(cluster.broker(1), "SASL_PLAINTEXT").to_string();
    let on_2 = listener_addr(cluster.broker(2), "SASL_PLAINTEXT").to_string();

    // Before: erin does not exist anywhere.
    python(
        "refused",
        &sasl_args(
            &on_2,
            "SASL_PLAINTEXT",
            "SCRAM-SHA-512",
            "erin",
            "erin-secret",
        ),
    )
    .assert_success("erin refused before she exists");
    let mut args = sasl_args(
        &on_1,
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
        "admin",
        "admin-secret",
    );
    args.extend(["--new-user", "erin", "--new-password", "erin-secret"]);
    python("alter-user", &args).assert_success("AlterUserScramCredentials on broker 1");
    // Broker 2 cached "no such user" a moment ago; it reads storage again within its cache
    // lifetime. Each attempt is a new client that either logs in or is refused.
    let login = strata_tests::wait::wait_until("erin logs in on broker 2", CLIENT_DEADLINE, || {
        let login = python(
            "login",
            &sasl_args(
                &on_2,
                "SASL_PLAINTEXT",
                "SCRAM-SHA-512",
                "erin",
                "erin-secret",
            ),
        );
        login.status.success().then_some(login)
    });
    assert!(
        login.stdout.contains(&format!("1={on_1}")) && login.stdout.contains(&format!("2={on_2}")),
        "broker 2 advertises both brokers' SASL endpoints: {}",
        login.stdout
    );
    for topic in ["secure-cluster-a", "secure-cluster-b", "secure-cluster-c"] {
        let mut args = sasl_args(
            &on_2,
            "SASL_PLAINTEXT",
            "SCRAM-SHA-512",
            "erin",
            "erin-secret",
        );
        args.extend(["--topic", topic]);
        python("round-trip", &args)
            .assert_success(&format!("round trip of {topic} through broker 2"));
    }
}

// ----- ACLs (authorizer = acl) -----

/// tests/python/acls.py COMMAND as `user` (SCRAM-SHA-512 over SASL_PLAINTEXT).
fn acls_py(command: &str, bootstrap: &str, user: &str, args: &[&str]) -> Finished {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/acls.py");
    let mut python = Command::new("python3");
    python
        .arg(&script)
        .arg(command)
        .args(["--bootstrap", bootstrap, "--user", user, "--password"])
        .arg(format!("{user}-secret"))
        .args(args);
    run_with_deadline(python, b"", CLIENT_DEADLINE)
}

/// `strata acls ARGS` against a PLAINTEXT listener.
fn acls_command(bootstrap: &str, args: &[&str]) -> Finished {
    let mut command = Command::new(strata_binary());
    command
        .arg("acls")
        .args(args)
        .args(["--bootstrap-server", bootstrap]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    run_with_deadline(command, b"", CLIENT_DEADLINE)
}

/// Exit code of acls.py for "refused with the authorization error asked about".
const REFUSED: i32 = 3;

/// With `--authorizer acl`, a principal without WRITE on a topic is refused
/// (TOPIC_AUTHORIZATION_FAILED) while one with it produces; Metadata lists only the topics a
/// principal may describe; a PREFIXED ACL on groups lets a consumer join `app-*` groups and no
/// other. ACLs are made with confluent-kafka's AdminClient by a super user and with `strata
/// acls` (over PLAINTEXT, whose `User:ANONYMOUS` is a super user here).
#[test]
fn acls_decide_who_produces_consumes_and_sees_which_topics() {
    let storage = SharedStorage::new();
    for user in ["admin", "alice", "bob"] {
        create_user(
            storage.url(),
            user,
            &format!("{user}-secret"),
            "SCRAM-SHA-512",
        );
    }
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args([
                "--listeners",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--authorizer",
                "acl",
                "--super-users",
                "User:admin;User:ANONYMOUS",
            ]),
    );
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    let plaintext = listener_addr(&broker, "PLAINTEXT").to_string();

    // The super user creates the topic by producing to it.
    acls_py("produce", &sasl, "admin", &["--topic", "orders"])
        .assert_success("admin produces to orders");
    let refused = acls_py("produce", &sasl, "alice", &["--topic", "orders"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");

    for operation in ["WRITE", "READ"] {
        acls_py(
            "add-acl",
            &sasl,
            "admin",
            &[
                "--principal",
                "User:alice",
                "--resource",
                "topic",
                "--name",
                "orders",
                "--operation",
                operation,
            ],
        )
        .assert_success(&format!("admin allows alice {operation} on orders"));
    }
    // Created through the broker the client talks to: enforced there at once.
    acls_py("produce", &sasl, "alice", &["--topic", "orders"])
        .assert_success("alice produces once allowed");
    let refused = acls_py("produce", &sasl, "bob", &["--topic", "orders"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");
    // librdkafka asks Metadata first, so the refusals counted are of DESCRIBE.
    assert!(
        metric(
            &broker,
            r#"strata_authorization_denied_total{resource_type="TOPIC",operation="DESCRIBE"}"#
        ) >= 2.0
    );

    // Metadata hides what bob may not describe; alice sees orders (WRITE implies DESCRIBE).
    let bob_sees = acls_py("topics", &sasl, "bob", &[]);
    bob_sees.assert_success("bob lists topics");
    assert!(!bob_sees.stdout.contains("orders"), "{}", bob_sees.stdout);
    let alice_sees = acls_py("topics", &sasl, "alice", &[]);
    alice_sees.assert_success("alice lists topics");
    assert!(
        alice_sees.stdout.lines().any(|l| l == "orders"),
        "{}",
        alice_sees.stdout
    );

    // A prefixed group ACL, made with `strata acls`.
    acls_command(
        &plaintext,
        &[
            "add",
            "--principal",
            "User:alice",
            "--group",
            "app-",
            "--pattern",
            "prefixed",
            "--operation",
            "READ",
        ],
    )
    .assert_success("strata acls add (prefixed group)");
    acls_py(
        "consume",
        &sasl,
        "alice",
        &["--topic", "orders", "--group", "app-billing"],
    )
    .assert_success("alice consumes in app-billing");
    let refused = acls_py(
        "consume",
        &sasl,
        "alice",
        &["--topic", "orders", "--group", "billing"],
    );
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");

    let listed = acls_command(&plaintext, &["list", "--json"]);
    listed.assert_success("strata acls list --json");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let acls = listed["acls"].as_array().unwrap();
    assert_eq!(acls.len(), 3, "{listed}");
    assert!(acls.iter().any(|a| a["resource_type"] == "GROUP"
        && a["pattern"] == "PREFIXED"
        && a["name"] == "app-"
        && a["principal"] == "User:alice"
        && a["operation"] == "READ"));

    // Removed: refused again.
    acls_command(
        &plaintext,
        &[
            "remove",
            "--principal",
            "User:alice",
            "--topic",
            "orders",
            "--operation",
            "WRITE",
        ],
    )
    .assert_success("strata acls remove");
    let refused = acls_py("produce", &sasl, "alice", &["--topic", "orders"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");
}

/// ACLs created through the Admin API on broker 1 are enforced by broker 2 of a 2-broker
/// cluster on the same storage: broker 2 sees the change marker move and reloads them.
#[test]
fn acls_created_on_one_broker_are_enforced_by_another() {
    let listeners = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0";
    let mut cluster = Cluster::start_with_env(
        2,
        "3s",
        "500ms",
        &[
            ("STRATA_LISTENERS", listeners),
            ("STRATA_AUTHORIZER", "acl"),
            ("STRATA_SUPER_USERS", "User:admin;User:ANONYMOUS"),
        ],
    );
    for user in ["admin", "carol"] {
        create_user(
            cluster.storage.url(),
            user,
            &format!("{user}-secret"),
            "SCRAM-SHA-512",
        );
    }
    let on_1 = listener_addr(cluster.broker(1), "SASL_PLAINTEXT").to_string();
    let on_2 = listener_addr(cluster.broker(2), "SASL_PLAINTEXT").to_string();
    acls_py("produce", &on_1, "admin", &["--topic", "shared"])
        .assert_success("admin creates shared");
    let refused = acls_py("produce", &on_2, "carol", &["--topic", "shared"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");

    acls_py(
        "add-acl",
        &on_1,
        "admin",
        &[
            "--principal",
            "User:carol",
            "--resource",
            "topic",
            "--name",
            "shared",
            "--operation",
            "WRITE",
        ],
    )
    .assert_success("admin allows carol WRITE through broker 1");
    // Broker 2 reloads within its acl_refresh_interval (1s); each attempt is a new client
    // that is either refused or produces.
    strata_tests::wait::wait_until("carol produces through broker 2", CLIENT_DEADLINE, || {
        let attempt = acls_py("produce", &on_2, "carol", &["--topic", "shared"]);
        match attempt.status.code() {
            Some(0) => Some(()),
            Some(REFUSED) => None,
            _ => panic!("neither produced nor refused: {attempt:?}"),
        }
    });
}

/// `strata ARGS` against `bootstrap`, logging in as `login` = (mechanism, user, password).
fn cli_as(bootstrap: &str, login: Option<(&str, &str, &str)>, args: &[&str]) -> Finished {
    let mut command = Command::new(strata_binary());
    command.args(args).args(["--bootstrap-server", bootstrap]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    if let Some((mechanism, user, password)) = login {
        command
            .env("STRATA_SASL_MECHANISM", mechanism)
            .env("STRATA_SASL_USERNAME", user)
            .env("STRATA_SASL_PASSWORD", password);
    }
    run_with_deadline(command, b"", CLIENT_DEADLINE)
}

/// The `strata` commands log in on a SASL_PLAINTEXT listener with SCRAM-SHA-512, SCRAM-SHA-256
/// and PLAIN — on the bootstrap connection and on the connections to leaders and coordinators
/// they open from Metadata — and a wrong password or no login is refused with a message.
#[test]
fn the_cli_logs_in_with_scram_and_plain_over_sasl_plaintext() {
    let storage = SharedStorage::new();
    create_user(storage.url(), "alice", "alice-secret", "SCRAM-SHA-512");
    create_user(storage.url(), "bob", "bob-secret", "SCRAM-SHA-256");
    let broker = secured_broker(&storage, None);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    let alice = Some(("SCRAM-SHA-512", "alice", "alice-secret"));
    let bob = Some(("SCRAM-SHA-256", "bob", "bob-secret"));
    let plain = Some(("PLAIN", "alice", "alice-secret"));

    cli_as(
        &sasl,
        alice,
        &["topic", "create", "cli-sasl", "--partitions", "2"],
    )
    .assert_success("topic create as alice (SCRAM-SHA-512)");
    let listed = cli_as(&sasl, bob, &["topic", "list", "--json"]);
    listed.assert_success("topic list as bob (SCRAM-SHA-256)");
    assert!(listed.stdout.contains("cli-sasl"), "{}", listed.stdout);
    // produce and consume talk to the partition's leader on a connection of their own.
    cli_as(
        &sasl,
        plain,
        &[
            "produce",
            "cli-sasl",
            "--partition",
            "1",
            "--value",
            "over-sasl",
        ],
    )
    .assert_success("produce with PLAIN");
    let consumed = cli_as(
        &sasl,
        bob,
        &[
            "consume",
            "cli-sasl",
            "--partition",
            "1",
            "--offset",
            "earliest",
            "--count",
            "1",
        ],
    );
    consumed.assert_success("consume as bob");
    assert!(consumed.stdout.contains("over-sasl"), "{}", consumed.stdout);

    let wrong = cli_as(
        &sasl,
        Some(("SCRAM-SHA-256", "bob", "not-bobs")),
        &["topic", "list"],
    );
    assert!(!wrong.status.success(), "a wrong password must fail");
    assert!(
        wrong.stderr.contains("logging in to") && wrong.stderr.contains("SCRAM-SHA-256"),
        "the error names the login: {}",
        wrong.stderr
    );
    let anonymous = cli_as(&sasl, None, &["topic", "list", "--request-timeout", "5s"]);
    assert!(
        !anonymous.status.success(),
        "a SASL listener refuses a client that does not log in: {}",
        anonymous.stdout
    );
}

/// `strata ARGS` over TLS: `tls` are the --security-protocol and --ssl-* flags, `login` the
/// SASL login (through the environment, as for a SASL_PLAINTEXT listener).
fn cli_tls(
    bootstrap: &str,
    tls: &[String],
    login: Option<(&str, &str, &str)>,
    args: &[&str],
) -> Finished {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(tls.iter().map(String::as_str));
    cli_as(bootstrap, login, &all)
}

/// The TLS flags for `strata`: the protocol, the CA file, and a client certificate if named.
fn tls_flags(certs: &Certificates, protocol: &str, cert: Option<&str>) -> Vec<String> {
    let mut flags = vec![
        "--security-protocol".to_string(),
        protocol.to_string(),
        "--ssl-ca-location".to_string(),
        certs.path("ca.pem").display().to_string(),
    ];
    if let Some(name) = cert {
        flags.extend([
            "--ssl-certificate-location".to_string(),
            certs.path(&format!("{name}.pem")).display().to_string(),
            "--ssl-key-location".to_string(),
            certs.path(&format!("{name}.key")).display().to_string(),
        ]);
    }
    flags
}

/// The `strata` commands speak TLS: on an SSL listener that requires client certificates
/// they create, produce to and consume from a topic with the CA file and a certificate
/// (including the connections to the partition's leader they open from Metadata); without
/// the certificate, or without the CA (the system's trust store does not know the test CA),
/// they fail with a TLS error.
#[test]
fn the_cli_speaks_tls_with_a_ca_file_and_a_client_certificate() {
    let certs = Certificates::make();
    certs.signed("ops", "/CN=ops", "ca", "ops.key", None);
    let storage = SharedStorage::new();
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(mtls_args(&certs, "required", &[])),
    );
    let tls = listener_addr(&broker, "SSL").to_string();
    let with_cert = tls_flags(&certs, "SSL", Some("ops"));
    cli_tls(
        &tls,
        &with_cert,
        None,
        &["topic", "create", "cli-tls", "--partitions", "2"],
    )
    .assert_success("topic create over SSL with a client certificate");
    cli_tls(
        &tls,
        &with_cert,
        None,
        &[
            "produce",
            "cli-tls",
            "--partition",
            "1",
            "--value",
            "over-tls",
        ],
    )
    .assert_success("produce over SSL");
    let consumed = cli_tls(
        &tls,
        &with_cert,
        None,
        &[
            "consume",
            "cli-tls",
            "--partition",
            "1",
            "--offset",
            "earliest",
            "--count",
            "1",
        ],
    );
    consumed.assert_success("consume over SSL");
    assert!(consumed.stdout.contains("over-tls"), "{}", consumed.stdout);

    let no_cert = cli_tls(
        &tls,
        &tls_flags(&certs, "SSL", None),
        None,
        &["topic", "list", "--request-timeout", "5s"],
    );
    assert!(
        !no_cert.status.success(),
        "a listener requiring certificates refuses a client without one: {}",
        no_cert.stdout
    );
    let no_ca = cli_as(&tls, None, &["topic", "list", "--security-protocol", "SSL"]);
    assert!(!no_ca.status.success(), "{}", no_ca.stdout);
    assert!(
        no_ca.stderr.contains("TLS"),
        "the error says TLS: {}",
        no_ca.stderr
    );
    let plaintext_files = cli_as(
        &tls,
        None,
        &["topic", "list", "--ssl-ca-location", "ca.pem"],
    );
    assert!(
        plaintext_files
            .stderr
            .contains("--security-protocol SSL or SASL_SSL"),
        "TLS files without a TLS protocol are refused: {}",
        plaintext_files.stderr
    );
}

/// On a SASL_SSL listener the `strata` commands run the TLS handshake, then the SCRAM login.
#[test]
fn the_cli_logs_in_with_scram_over_sasl_ssl() {
    let certs = Certificates::make();
    let storage = SharedStorage::new();
    create_user(storage.url(), "alice", "alice-secret", "SCRAM-SHA-512");
    let broker = secured_broker(&storage, Some(&certs));
    let sasl_ssl = listener_addr(&broker, "SASL_SSL").to_string();
    let flags = tls_flags(&certs, "SASL_SSL", None);
    let alice = Some(("SCRAM-SHA-512", "alice", "alice-secret"));
    cli_tls(
        &sasl_ssl,
        &flags,
        alice,
        &["topic", "create", "cli-sasl-ssl", "--partitions", "1"],
    )
    .assert_success("topic create over SASL_SSL");
    let listed = cli_tls(&sasl_ssl, &flags, alice, &["topic", "list", "--json"]);
    listed.assert_success("topic list over SASL_SSL");
    assert!(listed.stdout.contains("cli-sasl-ssl"), "{}", listed.stdout);
    let wrong = cli_tls(
        &sasl_ssl,
        &flags,
        Some(("SCRAM-SHA-512", "alice", "not-alices")),
        &["topic", "list"],
    );
    assert!(
        !wrong.status.success() && wrong.stderr.contains("logging in to"),
        "a wrong password over SASL_SSL fails at the login: {}",
        wrong.stderr
    );
}

/// One HTTP request to the console at `address`: (status, JSON body).
fn console_request(
    address: &str,
    method: &str,
    path: &str,
    login: Option<(&str, &str)>,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    use base64::Engine;
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the console");
    stream.set_read_timeout(Some(CLIENT_DEADLINE)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    if let Some((user, password)) = login {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        head.push_str(&format!("Authorization: Basic {basic}\r\n"));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    std::io::Write::write_all(&mut stream, format!("{head}{body}").as_bytes()).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let json = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

fn console_topics(address: &str, login: (&str, &str)) -> Vec<String> {
    let (status, json) = console_request(address, "GET", "/api/topics", Some(login), None);
    assert_eq!(status, 200, "{json}");
    json["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

/// With `console_sasl_mechanism`, the console logs its users in as Kafka users and talks to
/// the broker as them: no login or a wrong password is refused, a user sees only the topics
/// the ACLs let them describe, creating a topic needs the ACLs' CREATE, and a drain needs
/// ALTER on the cluster — the authorisation an admin client gets.
#[test]
fn the_console_logs_users_in_as_kafka_users_and_the_acls_decide() {
    let storage = SharedStorage::new();
    for user in ["admin", "alice"] {
        create_user(
            storage.url(),
            user,
            &format!("{user}-secret"),
            "SCRAM-SHA-512",
        );
    }
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args([
                "--listeners",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                "--authorizer",
                "acl",
                "--super-users",
                "User:admin",
                "--console-listen",
                "127.0.0.1:0",
            ])
            .with_config("console_sasl_mechanism = \"SCRAM-SHA-512\"\n"),
    );
    let line = broker
        .log_lines_containing("console on ")
        .pop()
        .expect("the broker logged its console address");
    let console = line
        .rsplit("console on ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .map(|url| {
            url.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .expect("an address");
    let admin = ("admin", "admin-secret");
    let alice = ("alice", "alice-secret");

    let (status, json) = console_request(&console, "GET", "/api/topics", None, None);
    assert_eq!(
        (status, json["login"].as_str()),
        (401, Some("sasl")),
        "{json}"
    );
    let (status, _) = console_request(
        &console,
        "GET",
        "/api/topics",
        Some(("alice", "wrong")),
        None,
    );
    assert_eq!(status, 401, "a wrong password is refused");

    let create = |login, name: &str| {
        console_request(
            &console,
            "POST",
            "/api/topics",
            Some(login),
            Some(&serde_json::json!({"name": name, "partitions": 1, "configs": {}})),
        )
    };
    let (status, json) = create(alice, "alices");
    assert_ne!(status, 200, "alice has no CREATE: {json}");
    let (status, json) = create(admin, "secret");
    assert_eq!(status, 200, "the super user creates: {json}");
    assert!(console_topics(&console, admin).contains(&"secret".to_string()));
    assert!(
        !console_topics(&console, alice).contains(&"secret".to_string()),
        "alice may not describe the topic, so the console does not show it to her"
    );
    assert!(!console_topics(&console, admin).contains(&"alices".to_string()));

    // Granted DESCRIBE (by the admin, through the strata command logged in over SASL), alice
    // sees it.
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    cli_as(
        &sasl,
        Some(("SCRAM-SHA-512", "admin", "admin-secret")),
        &[
            "acls",
            "add",
            "--principal",
            "User:alice",
            "--topic",
            "secret",
            "--operation",
            "DESCRIBE",
        ],
    )
    .assert_success("admin grants alice DESCRIBE on secret");
    strata_tests::wait::wait_until(
        "alice sees the topic she may describe",
        CLIENT_DEADLINE,
        || {
            console_topics(&console, alice)
                .contains(&"secret".to_string())
                .then_some(())
        },
    );

    // Drains are cluster writes: alice lacks ALTER on the cluster, the admin has it (and is
    // then told, past authorisation, that there is nothing to undrain).
    let (status, overview) = console_request(&console, "GET", "/api/overview", Some(admin), None);
    assert_eq!(status, 200, "{overview}");
    let node_id = overview["node_id"].as_i64().expect("the broker's id");
    let undrain = |login| {
        console_request(
            &console,
            "POST",
            "/api/brokers/undrain",
            Some(login),
            Some(&serde_json::json!({"broker": node_id})),
        )
    };
    let (status, json) = undrain(alice);
    assert_eq!(status, 403, "{json}");
    let (status, json) = undrain(admin);
    assert_eq!(status, 400, "past authorisation: {json}");
}

// ----- mTLS: client certificates, the principal mapping rules, reloading -----

/// `strata serve` arguments for an SSL listener (and a PLAINTEXT one) serving `certs`'s
/// server certificate, asking clients for certificates as `client_auth` says.
fn mtls_args(certs: &Certificates, client_auth: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listeners",
        "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--ssl-client-auth",
        client_auth,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    for (flag, file) in [
        ("--ssl-certificate", "server.pem"),
        ("--ssl-key", "server.key"),
        ("--ssl-truststore", "ca.pem"),
    ] {
        args.push(flag.to_string());
        args.push(certs.path(file).display().to_string());
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// acls.py COMMAND over the SSL listener with the client certificate `NAME.pem`.
fn acls_py_tls(
    command: &str,
    bootstrap: &str,
    certs: &Certificates,
    name: &str,
    args: &[&str],
) -> Finished {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/acls.py");
    let mut python = Command::new("python3");
    python
        .arg(&script)
        .arg(command)
        .args(["--bootstrap", bootstrap, "--protocol", "SSL", "--ca"])
        .arg(certs.path("ca.pem"))
        .arg("--cert")
        .arg(certs.path(&format!("{name}.pem")))
        .arg("--key")
        .arg(certs.path(&format!("{name}.key")))
        .args(args);
    run_with_deadline(python, b"", CLIENT_DEADLINE)
}

/// security.py COMMAND over the SSL listener, with the client certificate `NAME.pem` if any.
fn security_py_tls(
    command: &str,
    bootstrap: &str,
    certs: &Certificates,
    cert: Option<&str>,
    args: &[&str],
) -> Finished {
    let ca = certs.path("ca.pem").display().to_string();
    let mut all = vec!["--bootstrap", bootstrap, "--protocol", "SSL", "--ca", &ca];
    let paths = cert.map(|name| {
        (
            certs.path(&format!("{name}.pem")).display().to_string(),
            certs.path(&format!("{name}.key")).display().to_string(),
        )
    });
    if let Some((pem, key)) = &paths {
        all.extend(["--cert", pem, "--key", key]);
    }
    all.extend(args);
    python(command, &all)
}

/// `ssl_client_auth = required`: a client whose certificate the truststore's CA signed is
/// `User:<mapped subject>` (`CN=Alice,OU=eng,O=Acme` → `alice` through the rule), which is
/// what the ACLs see: refused before an ACL names `User:alice`, producing and consuming
/// after. A client without a certificate, and one whose certificate another CA signed, are
/// refused at the handshake; a certificate no rule maps is refused after it.
#[test]
fn mtls_required_maps_the_certificate_subject_to_the_principal_acls_see() {
    let certs = Certificates::make();
    certs.signed("alice", "/O=Acme/OU=eng/CN=Alice", "ca", "alice.key", None);
    certs.signed("carol", "/O=Other/CN=carol", "ca", "carol.key", None);
    certs.ca("rogue-ca");
    certs.signed(
        "mallory",
        "/O=Acme/OU=eng/CN=Alice",
        "rogue-ca",
        "mallory.key",
        None,
    );
    let storage = SharedStorage::new();
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(mtls_args(
                &certs,
                "required",
                &[
                    "--ssl-principal-mapping-rules",
                    "RULE:^CN=([^,]+),OU=eng,O=Acme$/$1/L",
                    "--authorizer",
                    "acl",
                    "--super-users",
                    "User:ANONYMOUS",
                ],
            )),
    );
    let tls = listener_addr(&broker, "SSL").to_string();
    let plaintext = listener_addr(&broker, "PLAINTEXT").to_string();

    let refused = acls_py_tls("produce", &tls, &certs, "alice", &["--topic", "orders"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");
    acls_command(
        &plaintext,
        &[
            "add",
            "--principal",
            "User:alice",
            "--topic",
            "orders",
            "--pattern",
            "prefixed",
            "--operation",
            "ALL",
        ],
    )
    .assert_success("strata acls add for User:alice");
    // security.py's consumer names a group (it only assigns, but librdkafka looks it up).
    acls_command(
        &plaintext,
        &[
            "add",
            "--principal",
            "User:alice",
            "--group",
            "security-test",
            "--operation",
            "READ",
        ],
    )
    .assert_success("strata acls add for alice's group");
    acls_py_tls("produce", &tls, &certs, "alice", &["--topic", "orders"])
        .assert_success("alice produces with her certificate once User:alice may");
    security_py_tls(
        "round-trip",
        &tls,
        &certs,
        Some("alice"),
        &["--topic", "orders-rt"],
    )
    .assert_success("alice's round trip over SSL");
    let successes = metric(
        &broker,
        r#"strata_authentications_total{mechanism="TLS",result="success"}"#,
    );
    assert!(successes >= 1.0, "{successes}");

    let handshakes = |broker: &StrataProcess| {
        metric(
            broker,
            r#"strata_authentications_total{mechanism="TLS",result="tls_handshake"}"#,
        )
    };
    let before = handshakes(&broker);
    security_py_tls("tls-refused", &tls, &certs, None, &[])
        .assert_success("a client without a certificate is refused");
    security_py_tls("tls-refused", &tls, &certs, Some("mallory"), &[])
        .assert_success("a certificate from another CA is refused");
    let after = handshakes(&broker);
    assert!(after >= before + 2.0, "{before} -> {after}");

    security_py_tls("tls-refused", &tls, &certs, Some("carol"), &[])
        .assert_success("a certificate no mapping rule matches is refused");
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="TLS",result="principal_mapping"}"#
        ) >= 1.0
    );
}

/// `ssl_client_auth = requested`: a client without a certificate connects as
/// `User:ANONYMOUS` (a super user here, so it produces), one with a certificate as its
/// subject (DEFAULT rule: the whole RFC 2253 subject), refused without an ACL.
#[test]
fn mtls_requested_lets_clients_without_a_certificate_in_as_anonymous() {
    let certs = Certificates::make();
    certs.signed("alice", "/O=Acme/CN=alice", "ca", "alice.key", None);
    let storage = SharedStorage::new();
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(mtls_args(
                &certs,
                "requested",
                &["--authorizer", "acl", "--super-users", "User:ANONYMOUS"],
            )),
    );
    let tls = listener_addr(&broker, "SSL").to_string();
    security_py_tls("round-trip", &tls, &certs, None, &["--topic", "anonymous"])
        .assert_success("a client without a certificate, as User:ANONYMOUS");
    let refused = acls_py_tls("produce", &tls, &certs, "alice", &["--topic", "anonymous"]);
    assert_eq!(refused.status.code(), Some(REFUSED), "{refused:?}");
    let plaintext = listener_addr(&broker, "PLAINTEXT").to_string();
    acls_command(
        &plaintext,
        &[
            "add",
            "--principal",
            "User:CN=alice,O=Acme",
            "--topic",
            "anonymous",
            "--operation",
            "WRITE",
        ],
    )
    .assert_success("strata acls add for the certificate's subject");
    acls_py_tls("produce", &tls, &certs, "alice", &["--topic", "anonymous"])
        .assert_success("alice's certificate is User:CN=alice,O=Acme");
}

/// A replaced certificate is served to new connections within `ssl_reload_interval` while
/// a connection opened before keeps working; a file that does not load is counted and the
/// previous certificate kept.
#[test]
fn a_replaced_certificate_is_served_to_new_connections_and_old_ones_keep_going() {
    use std::io::{BufRead, BufReader, Write};

    let certs = Certificates::make();
    // The renewed certificate keeps the key, as a renewal usually does.
    certs.signed(
        "renewed",
        "/CN=localhost",
        "ca",
        "server.key",
        Some("san.ext"),
    );
    let storage = SharedStorage::new();
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(mtls_args(
                &certs,
                "none",
                &["--ssl-reload-interval", "200ms"],
            )),
    );
    let tls = listener_addr(&broker, "SSL").to_string();
    let served = || {
        let out = security_py_tls("served-cert", &tls, &certs, None, &[]);
        out.assert_success("served-cert");
        out.stdout.trim().to_string()
    };
    let digest_of = |name: &str| {
        let mut command = Command::new("openssl");
        command
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(certs.path(name));
        let out = run_with_deadline(command, b"", CLIENT_DEADLINE);
        out.assert_success("openssl x509 -fingerprint");
        // `sha256 Fingerprint=AB:CD:...`
        out.stdout
            .trim()
            .rsplit('=')
            .next()
            .unwrap_or_default()
            .replace(':', "")
            .to_ascii_lowercase()
    };
    let original = served();
    assert_eq!(original, digest_of("server.pem"));

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/security.py");
    let mut held = Command::new("python3")
        .arg(&script)
        .args(["hold", "--bootstrap", &tls, "--ca"])
        .arg(certs.path("ca.pem"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let out = BufReader::new(held.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let first = lines
        .recv_timeout(CLIENT_DEADLINE)
        .expect("the held connection's first answer");
    assert_eq!(first, format!("served {original}"));

    // A broken certificate file: counted, and the old certificate still served.
    let pem = std::fs::read(certs.path("server.pem")).unwrap();
    std::fs::write(
        certs.path("server.pem"),
        b"-----BEGIN CERTIFICATE-----\nnot base64\n",
    )
    .unwrap();
    strata_tests::wait::wait_until("the broken file is seen", CLIENT_DEADLINE, || {
        (metric(&broker, r#"strata_tls_reloads_total{result="error"}"#) >= 1.0).then_some(())
    });
    assert_eq!(served(), original);
    std::fs::write(certs.path("server.pem"), pem).unwrap();

    // Renewed: swapped in by rename, as deployment tools do.
    std::fs::copy(certs.path("renewed.pem"), certs.path("renewed.tmp")).unwrap();
    std::fs::rename(certs.path("renewed.tmp"), certs.path("server.pem")).unwrap();
    let renewed = digest_of("renewed.pem");
    assert_ne!(renewed, original);
    strata_tests::wait::wait_until(
        "new connections get the renewed certificate",
        CLIENT_DEADLINE,
        || (served() == renewed).then_some(()),
    );
    assert!(metric(&broker, r#"strata_tls_reloads_total{result="success"}"#) >= 1.0);

    let mut stdin = held.stdin.take().unwrap();
    stdin.write_all(b"again\n").unwrap();
    stdin.flush().unwrap();
    let again = lines
        .recv_timeout(CLIENT_DEADLINE)
        .expect("the held connection's second answer");
    assert_eq!(
        again, "answered",
        "the connection opened before the swap still works"
    );
    drop(stdin);
    let finished = strata_tests::wait::wait_until("the held client exits", CLIENT_DEADLINE, || {
        held.try_wait().ok().flatten()
    });
    assert!(finished.success(), "{finished}");

    security_py_tls("round-trip", &tls, &certs, None, &["--topic", "renewed"])
        .assert_success("confluent-kafka round trip against the renewed certificate");
}

// ----- OAUTHBEARER and re-authentication (KIP-368) -----

/// tests/python/oauth.py COMMAND with the keys in `keys` and these arguments.
fn oauth_py(command: &str, keys: &Path, args: &[&str]) -> Finished {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/oauth.py");
    let mut python = Command::new("python3");
    python
        .arg(&script)
        .arg(command)
        .arg("--dir")
        .arg(keys)
        .args(args);
    run_with_deadline(python, b"", CLIENT_DEADLINE)
}

/// A broker with PLAINTEXT and SASL_PLAINTEXT listeners offering OAUTHBEARER (tokens checked
/// against `keys/jwks.json`, issuer `https://issuer.test`, audience `strata`) and
/// SCRAM-SHA-512, the ACLs on (`User:ANONYMOUS` a super user), and `extra` arguments.
fn oauth_broker(storage: &SharedStorage, keys: &Path, extra: &[&str]) -> StrataProcess {
    let jwks = keys.join("jwks.json").display().to_string();
    let mut args = vec![
        "--listeners",
        "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--sasl-enabled-mechanisms",
        "OAUTHBEARER,SCRAM-SHA-512",
        "--sasl-oauthbearer-jwks-file",
        &jwks,
        "--sasl-oauthbearer-expected-issuer",
        "https://issuer.test",
        "--sasl-oauthbearer-expected-audience",
        "strata",
        "--authorizer",
        "acl",
        "--super-users",
        "User:ANONYMOUS",
    ];
    args.extend(extra);
    StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args(args.iter().map(|a| a.to_string()).collect::<Vec<_>>()),
    )
}

fn allow_topic_and_group(plaintext: &str, principal: &str, topic: &str, group: &str) {
    acls_command(
        plaintext,
        &[
            "add",
            "--principal",
            principal,
            "--topic",
            topic,
            "--operation",
            "ALL",
        ],
    )
    .assert_success("strata acls add (topic)");
    acls_command(
        plaintext,
        &[
            "add",
            "--principal",
            principal,
            "--group",
            group,
            "--operation",
            "READ",
        ],
    )
    .assert_success("strata acls add (group)");
}

/// OAUTHBEARER with confluent-kafka's `oauth_cb`: RS256 and ES256 tokens signed by keys of
/// the JWKS log in as `User:<sub>` (the only principal the ACLs let write the topic); an
/// expired token, one for another audience and one from another issuer are refused with an
/// authentication error.
#[test]
fn oauthbearer_tokens_signed_by_a_jwks_key_log_in_as_their_subject() {
    let keys = tempfile::Builder::new()
        .prefix("strata-oauth-")
        .tempdir()
        .unwrap();
    oauth_py("keys", keys.path(), &[]).assert_success("oauth.py keys");
    let storage = SharedStorage::new();
    let broker = oauth_broker(&storage, keys.path(), &[]);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    let plaintext = listener_addr(&broker, "PLAINTEXT").to_string();
    allow_topic_and_group(&plaintext, "User:alice", "oauth", "oauth-test");

    for alg in ["RS256", "ES256"] {
        oauth_py(
            "round-trip",
            keys.path(),
            &[
                "--bootstrap",
                &sasl,
                "--alg",
                alg,
                "--sub",
                "alice",
                "--topic",
                "oauth",
            ],
        )
        .assert_success(&format!("{alg} round trip as alice"));
    }
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="OAUTHBEARER",result="success"}"#
        ) >= 2.0
    );

    for (what, args) in [
        ("an expired token", vec!["--expires-in", "-600"]),
        (
            "a token for another audience",
            vec!["--aud", "someone-else"],
        ),
        (
            "a token from another issuer",
            vec!["--iss", "https://evil.test"],
        ),
    ] {
        let mut all = vec!["--bootstrap", sasl.as_str(), "--sub", "alice"];
        all.extend(args);
        let refused = oauth_py("refused", keys.path(), &all);
        refused.assert_success(what);
        assert!(
            refused.stdout.contains("invalid_token"),
            "{what}: {}",
            refused.stdout
        );
    }
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="OAUTHBEARER",result="invalid_token"}"#
        ) >= 3.0
    );
}

/// KIP-368 with confluent-kafka: sessions last 2s (`connections_max_reauth`), or less when
/// the OAUTHBEARER token expires sooner; the producer logs in again on its connection as
/// they run out and keeps delivering for several lifetimes, and no connection is closed
/// for an expired session.
#[test]
fn a_producer_keeps_working_across_session_lifetimes_by_reauthenticating() {
    let keys = tempfile::Builder::new()
        .prefix("strata-oauth-")
        .tempdir()
        .unwrap();
    oauth_py("keys", keys.path(), &[]).assert_success("oauth.py keys");
    let storage = SharedStorage::new();
    let broker = oauth_broker(&storage, keys.path(), &["--connections-max-reauth", "2s"]);
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT").to_string();
    let plaintext = listener_addr(&broker, "PLAINTEXT").to_string();
    allow_topic_and_group(&plaintext, "User:alice", "reauth", "oauth-test");

    oauth_py(
        "keep-producing",
        keys.path(),
        &[
            "--bootstrap",
            &sasl,
            "--sub",
            "alice",
            "--topic",
            "reauth",
            // Tokens for 30s: the 2s session, not the token, sets the lifetime.
            "--lifetime",
            "30",
            "--records",
            "8",
            "--pause",
            "1",
        ],
    )
    .assert_success("keep producing across session lifetimes");
    let reauthenticated = metric(
        &broker,
        r#"strata_authentications_total{mechanism="OAUTHBEARER",result="reauthenticated"}"#,
    );
    assert!(reauthenticated >= 2.0, "{reauthenticated}");
    assert_eq!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="other",result="session_expired"}"#
        ),
        0.0
    );
}

/// SaslAuthenticate v1+ tells the session's lifetime; a connection that does not log in
/// again before it ends is closed on its next request, as Kafka closes it; with
/// `connections_max_reauth` off the lifetime is 0 and the session does not end.
#[test]
fn an_expired_session_that_did_not_reauthenticate_is_closed_on_its_next_request() {
    use kafka_protocol::messages::SaslAuthenticateRequest;

    let storage = SharedStorage::new();
    create_user(storage.url(), "erin", "erin-secret", "SCRAM-SHA-512");
    let login = |addr: SocketAddr| {
        let mut raw = RawConnection::connect(addr);
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str("PLAIN");
        assert_eq!(raw.request(1, &handshake).error_code, 0);
        let mut authenticate = SaslAuthenticateRequest::default();
        authenticate.auth_bytes = bytes::Bytes::from_static(b"\0erin\0erin-secret");
        let response = raw.request(2, &authenticate);
        assert_eq!(response.error_code, 0, "{response:?}");
        (raw, response.session_lifetime_ms)
    };

    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_storage_url(storage.url())
            .with_args([
                "--listeners",
                "SASL_PLAINTEXT://127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--connections-max-reauth",
                "1500ms",
            ]),
    );
    let sasl = listener_addr(&broker, "SASL_PLAINTEXT");
    let (mut raw, lifetime) = login(sasl);
    assert_eq!(lifetime, 1500);
    assert_eq!(raw.request(4, &MetadataRequest::default()).brokers.len(), 1);
    strata_tests::wait::wait_until(
        "the expired session's next request closes the connection",
        CLOSE_DEADLINE,
        || {
            raw.send(4, &MetadataRequest::default());
            match raw.read_frame(CLOSE_DEADLINE) {
                strata_tests::raw::ReadOutcome::Closed => Some(()),
                _ => None,
            }
        },
    );
    assert!(
        metric(
            &broker,
            r#"strata_authentications_total{mechanism="other",result="session_expired"}"#
        ) >= 1.0
    );

    // One broker at a time on the storage, as outside cluster mode.
    drop(broker);
    let unlimited = secured_broker(&storage, None);
    let (mut raw, lifetime) = login(listener_addr(&unlimited, "SASL_PLAINTEXT"));
    assert_eq!(lifetime, 0, "connections_max_reauth off");
    assert!(!raw
        .request(4, &MetadataRequest::default())
        .brokers
        .is_empty());
}
