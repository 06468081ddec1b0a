//! `strata acls add|remove|list`: Kafka's ACLs through CreateAcls, DeleteAcls and DescribeAcls
//! (what `kafka-acls.sh` sends), so they work against any broker of the cluster.
//!
//! The command connects as any Kafka-protocol command does (PLAINTEXT): the broker sees it as
//! `User:ANONYMOUS`, which needs ALTER (add, remove) or DESCRIBE (list) on the cluster, or to
//! be a super user — typically on a PLAINTEXT listener bound to loopback.

use anyhow::{bail, Context};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
use serde_json::json;

use super::{out, out_json, table, Connect};
use crate::kafka_client::{check, str_bytes};

/// CreateAcls, DescribeAcls and DeleteAcls v3: flexible, what Kafka 4.x clients send.
const VERSION: i16 = 3;

/// Kafka's codes (`ResourceType`, `PatternType`, `AclOperation`, `AclPermissionType`).
const ANY: i8 = 1;
const MATCH: i8 = 2;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;

const RESOURCE_TYPES: [(&str, i8); 5] = [
    ("TOPIC", 2),
    ("GROUP", 3),
    ("CLUSTER", 4),
    ("TRANSACTIONAL_ID", 5),
    ("DELEGATION_TOKEN", 6),
];

const OPERATIONS: [(&str, i8); 11] = [
    ("ALL", 2),
    ("READ", 3),
    ("WRITE", 4),
    ("CREATE", 5),
    ("DELETE", 6),
    ("ALTER", 7),
    ("DESCRIBE", 8),
    ("CLUSTER_ACTION", 9),
    ("DESCRIBE_CONFIGS", 10),
    ("ALTER_CONFIGS", 11),
    ("IDEMPOTENT_WRITE", 12),
];

fn name_of(table: &[(&'static str, i8)], code: i8) -> String {
    table
        .iter()
        .find(|(_, c)| *c == code)
        .map_or_else(|| format!("UNKNOWN({code})"), |(n, _)| (*n).to_string())
}

fn pattern_name(code: i8) -> String {
    match code {
        LITERAL => "LITERAL".into(),
        PREFIXED => "PREFIXED".into(),
        other => format!("UNKNOWN({other})"),
    }
}

fn permission_name(code: i8) -> String {
    match code {
        2 => "DENY".into(),
        3 => "ALLOW".into(),
        other => format!("UNKNOWN({other})"),
    }
}

fn operation(text: &str) -> anyhow::Result<i8> {
    let upper = text.trim().to_ascii_uppercase().replace('-', "_");
    OPERATIONS
        .iter()
        .find(|(n, _)| *n == upper)
        .map(|(_, c)| *c)
        .with_context(|| {
            format!("--operation {text:?} is not one of ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE")
        })
}

/// Which resource: exactly one of these (or none, for a filter meaning any).
#[derive(Debug, clap::Args)]
pub struct Resource {
    /// A topic (`*` for every topic).
    #[arg(long, value_name = "NAME")]
    topic: Option<String>,
    /// A consumer group (`*` for every group).
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// The cluster itself (`kafka-cluster`).
    #[arg(long)]
    cluster: bool,
    /// A transactional id.
    #[arg(long, value_name = "ID")]
    transactional_id: Option<String>,
    /// A delegation token.
    #[arg(long, value_name = "ID")]
    delegation_token: Option<String>,
    /// How the name is matched: literal or prefixed (add; remove's default is literal);
    /// list also takes any (the default: every pattern named so) and match (every ACL that
    /// applies to the named resource).
    #[arg(long, value_name = "TYPE")]
    pattern: Option<String>,
}

impl Resource {
    /// (resource type, name), None when no resource was named.
    fn named(&self) -> anyhow::Result<Option<(i8, String)>> {
        let mut given = Vec::new();
        if let Some(t) = &self.topic {
            given.push((2, t.clone()));
        }
        if let Some(g) = &self.group {
            given.push((3, g.clone()));
        }
        if self.cluster {
            given.push((4, "kafka-cluster".to_string()));
        }
        if let Some(t) = &self.transactional_id {
            given.push((5, t.clone()));
        }
        if let Some(t) = &self.delegation_token {
            given.push((6, t.clone()));
        }
        match given.len() {
            0 => Ok(None),
            1 => Ok(given.pop()),
            _ => bail!("name one resource: --topic, --group, --cluster, --transactional-id or --delegation-token"),
        }
    }

    fn pattern(&self, default: i8, filter: bool) -> anyhow::Result<i8> {
        let Some(text) = &self.pattern else {
            return Ok(default);
        };
        match text.to_ascii_lowercase().as_str() {
            "literal" => Ok(LITERAL),
            "prefixed" => Ok(PREFIXED),
            "any" if filter => Ok(ANY),
            "match" if filter => Ok(MATCH),
            _ => bail!(
                "--pattern {text:?} is not literal or prefixed{}",
                if filter { ", any or match" } else { "" }
            ),
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum AclsCommand {
    /// Allow (or with --deny, deny) a principal operations on a resource (CreateAcls).
    Add {
        #[command(flatten)]
        connect: Connect,
        #[command(flatten)]
        resource: Resource,
        /// Who, e.g. User:alice, or User:* for every user.
        #[arg(long, value_name = "PRINCIPAL")]
        principal: String,
        /// The client address the ACL applies to [default: * (any)].
        #[arg(long, value_name = "IP", default_value = "*")]
        host: String,
        /// An operation (repeatable): ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE,
        /// CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE.
        #[arg(long = "operation", value_name = "OP", required = true)]
        operations: Vec<String>,
        /// Deny instead of allow (a DENY wins over every ALLOW).
        #[arg(long)]
        deny: bool,
    },
    /// Remove the ACLs matching a filter (DeleteAcls); what is not given matches anything.
    Remove {
        #[command(flatten)]
        connect: Connect,
        #[command(flatten)]
        resource: Resource,
        #[arg(long, value_name = "PRINCIPAL")]
        principal: Option<String>,
        #[arg(long, value_name = "IP")]
        host: Option<String>,
        /// Only these operations (repeatable) [default: any].
        #[arg(long = "operation", value_name = "OP")]
        operations: Vec<String>,
        /// Only DENY ACLs (--deny) [default: both].
        #[arg(long)]
        deny: bool,
        /// Only ALLOW ACLs.
        #[arg(long, conflicts_with = "deny")]
        allow: bool,
    },
    /// List the ACLs matching a filter (DescribeAcls).
    List {
        #[command(flatten)]
        connect: Connect,
        #[command(flatten)]
        resource: Resource,
        #[arg(long, value_name = "PRINCIPAL")]
        principal: Option<String>,
    },
}

pub async fn run(command: AclsCommand) -> anyhow::Result<()> {
    match command {
        AclsCommand::Add {
            connect,
            resource,
            principal,
            host,
            operations,
            deny,
        } => add(&connect, &resource, &principal, &host, &operations, deny).await,
        AclsCommand::Remove {
            connect,
            resource,
            principal,
            host,
            operations,
            deny,
            allow,
        } => {
            let permission = match (deny, allow) {
                (true, _) => 2,
                (_, true) => 3,
                _ => ANY,
            };
            remove(
                &connect,
                &resource,
                principal.as_deref(),
                host.as_deref(),
                &operations,
                permission,
            )
            .await
        }
        AclsCommand::List {
            connect,
            resource,
            principal,
        } => list(&connect, &resource, principal.as_deref()).await,
    }
}

async fn add(
    connect: &Connect,
    resource: &Resource,
    principal: &str,
    host: &str,
    operations: &[String],
    deny: bool,
) -> anyhow::Result<()> {
    let Some((resource_type, name)) = resource.named()? else {
        bail!("name the resource: --topic, --group, --cluster, --transactional-id or --delegation-token");
    };
    let pattern = resource.pattern(LITERAL, false)?;
    let mut request = CreateAclsRequest::default();
    for op in operations {
        let mut c = AclCreation::default();
        c.resource_type = resource_type;
        c.resource_name = str_bytes(&name);
        c.resource_pattern_type = pattern;
        c.principal = str_bytes(principal);
        c.host = str_bytes(host);
        c.operation = operation(op)?;
        c.permission_type = if deny { 2 } else { 3 };
        request.creations.push(c);
    }
    let (mut client, _) = connect.client().await?;
    let response = client.request(VERSION, &request).await?;
    let mut added = Vec::new();
    for (op, result) in operations.iter().zip(&response.results) {
        check(
            result.error_code,
            || format!("adding {op} for {principal} on {name}"),
            result.error_message.as_ref(),
        )?;
        added.push(op.to_ascii_uppercase());
    }
    let binding = json!({
        "resource_type": name_of(&RESOURCE_TYPES, resource_type),
        "name": name,
        "pattern": pattern_name(pattern),
        "principal": principal,
        "host": host,
        "operations": added,
        "permission": if deny { "DENY" } else { "ALLOW" },
    });
    if connect.json {
        out_json(&json!({ "added": binding }));
    } else {
        out(&format!(
            "added: {} {principal} {} on {} {name} ({}) from {host}",
            if deny { "DENY" } else { "ALLOW" },
            added.join(","),
            name_of(&RESOURCE_TYPES, resource_type),
            pattern_name(pattern)
        ));
    }
    Ok(())
}

/// One ACL as printed: resource type, pattern, name, principal, host, operation, permission.
type Row = [String; 7];

fn print(connect: &Connect, key: &str, rows: &[Row]) {
    if connect.json {
        let acls: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "resource_type": r[0], "pattern": r[1], "name": r[2], "principal": r[3],
                    "host": r[4], "operation": r[5], "permission": r[6],
                })
            })
            .collect();
        out_json(&json!({ key: acls }));
    } else {
        let rows: Vec<Vec<String>> = rows.iter().map(|r| r.to_vec()).collect();
        out(&table(
            &[
                "RESOURCE",
                "PATTERN",
                "NAME",
                "PRINCIPAL",
                "HOST",
                "OPERATION",
                "PERMISSION",
            ],
            &rows,
        ));
    }
}

async fn remove(
    connect: &Connect,
    resource: &Resource,
    principal: Option<&str>,
    host: Option<&str>,
    operations: &[String],
    permission: i8,
) -> anyhow::Result<()> {
    let named = resource.named()?;
    let pattern = resource.pattern(LITERAL, true)?;
    let ops: Vec<i8> = if operations.is_empty() {
        vec![ANY]
    } else {
        operations
            .iter()
            .map(|o| operation(o))
            .collect::<anyhow::Result<_>>()?
    };
    let mut request = DeleteAclsRequest::default();
    for op in ops {
        let mut f = DeleteAclsFilter::default();
        f.resource_type_filter = named.as_ref().map_or(ANY, |(t, _)| *t);
        f.resource_name_filter = named.as_ref().map(|(_, n)| str_bytes(n));
        f.pattern_type_filter = pattern;
        f.principal_filter = principal.map(str_bytes);
        f.host_filter = host.map(str_bytes);
        f.operation = op;
        f.permission_type = permission;
        request.filters.push(f);
    }
    let (mut client, _) = connect.client().await?;
    let response = client.request(VERSION, &request).await?;
    let mut rows = Vec::new();
    for result in &response.filter_results {
        check(
            result.error_code,
            || "removing ACLs".to_string(),
            result.error_message.as_ref(),
        )?;
        for m in &result.matching_acls {
            rows.push([
                name_of(&RESOURCE_TYPES, m.resource_type),
                pattern_name(m.pattern_type),
                m.resource_name.to_string(),
                m.principal.to_string(),
                m.host.to_string(),
                name_of(&OPERATIONS, m.operation),
                permission_name(m.permission_type),
            ]);
        }
    }
    print(connect, "removed", &rows);
    Ok(())
}

async fn list(
    connect: &Connect,
    resource: &Resource,
    principal: Option<&str>,
) -> anyhow::Result<()> {
    let named = resource.named()?;
    let mut request = DescribeAclsRequest::default();
    request.resource_type_filter = named.as_ref().map_or(ANY, |(t, _)| *t);
    request.resource_name_filter = named.as_ref().map(|(_, n)| str_bytes(n));
    request.pattern_type_filter = resource.pattern(ANY, true)?;
    request.principal_filter = principal.map(str_bytes);
    // The request's default is the empty host, which no ACL has.
    request.host_filter = None;
    request.operation = ANY;
    request.permission_type = ANY;
    let (mut client, _) = connect.client().await?;
    let response = client.request(VERSION, &request).await?;
    check(
        response.error_code,
        || "listing ACLs".to_string(),
        response.error_message.as_ref(),
    )?;
    let mut rows = Vec::new();
    for r in &response.resources {
        for acl in &r.acls {
            rows.push([
                name_of(&RESOURCE_TYPES, r.resource_type),
                pattern_name(r.pattern_type),
                r.resource_name.to_string(),
                acl.principal.to_string(),
                acl.host.to_string(),
                name_of(&OPERATIONS, acl.operation),
                permission_name(acl.permission_type),
            ]);
        }
    }
    print(connect, "acls", &rows);
    Ok(())
}
