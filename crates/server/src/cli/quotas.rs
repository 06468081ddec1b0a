//! `strata quotas describe|alter`: client quotas (Kafka's `kafka-configs --entity-type users
//! --entity-type clients`) through DescribeClientQuotas and AlterClientQuotas v1.

use anyhow::bail;
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{AlterClientQuotasRequest, DescribeClientQuotasRequest};
use serde_json::json;

use super::{key_value, out, out_json, table, Connect};
use crate::kafka_client::{check, str_bytes};

/// The version both Strata and Kafka 4.x accept (the flexible one).
const VERSION: i16 = 1;

/// Which entity: a user and/or a client id, each a name or the default.
#[derive(Debug, clap::Args)]
pub struct EntityArgs {
    /// The user (principal name) the quota is for.
    #[arg(long, value_name = "NAME", conflicts_with = "user_default")]
    pub user: Option<String>,
    /// The default for every user (`<default>`).
    #[arg(long)]
    pub user_default: bool,
    /// The client id the quota is for.
    #[arg(long, value_name = "ID", conflicts_with = "client_id_default")]
    pub client_id: Option<String>,
    /// The default for every client id (`<default>`).
    #[arg(long)]
    pub client_id_default: bool,
}

impl EntityArgs {
    /// (type, name or None for the default) of each part given.
    fn parts(&self) -> Vec<(&'static str, Option<String>)> {
        let mut parts = Vec::new();
        if self.user.is_some() || self.user_default {
            parts.push(("user", self.user.clone()));
        }
        if self.client_id.is_some() || self.client_id_default {
            parts.push(("client-id", self.client_id.clone()));
        }
        parts
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum QuotasCommand {
    /// Show the quotas of the entities matching a filter (all of them without one).
    Describe {
        #[command(flatten)]
        entity: EntityArgs,
        /// Only entities with no other part than those given (a user alone, not a user
        /// with a client id).
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Set or remove quotas of one entity: producer_byte_rate, consumer_byte_rate,
    /// request_percentage.
    Alter {
        #[command(flatten)]
        entity: EntityArgs,
        /// Set a quota, e.g. producer_byte_rate=1048576 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Remove a quota (repeatable).
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
        /// Have the broker check the change without making it.
        #[arg(long)]
        validate_only: bool,
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn run(command: QuotasCommand) -> anyhow::Result<()> {
    match command {
        QuotasCommand::Describe {
            entity,
            strict,
            connect,
        } => describe(&connect, &entity, strict).await,
        QuotasCommand::Alter {
            entity,
            set,
            delete,
            validate_only,
            connect,
        } => alter(&connect, &entity, &set, &delete, validate_only).await,
    }
}

fn entity_text(parts: &[(String, Option<String>)]) -> String {
    parts
        .iter()
        .map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or("<default>")))
        .collect::<Vec<_>>()
        .join(",")
}

async fn describe(connect: &Connect, entity: &EntityArgs, strict: bool) -> anyhow::Result<()> {
    let components = entity
        .parts()
        .into_iter()
        .map(|(entity_type, name)| {
            let component = ComponentData::default().with_entity_type(str_bytes(entity_type));
            match name {
                Some(name) => component
                    .with_match_type(0)
                    .with_match(Some(str_bytes(&name))),
                // The codec's default match string is "", which Kafka refuses with DEFAULT.
                None => component.with_match_type(1).with_match(None),
            }
        })
        .collect();
    let request = DescribeClientQuotasRequest::default()
        .with_components(components)
        .with_strict(strict);
    let (mut client, _) = connect.client().await?;
    let response = client.request(VERSION, &request).await?;
    check(
        response.error_code,
        || "describing client quotas".to_string(),
        response.error_message.as_ref(),
    )?;
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    for entry in response.entries.unwrap_or_default() {
        let parts: Vec<(String, Option<String>)> = entry
            .entity
            .iter()
            .map(|e| {
                (
                    e.entity_type.to_string(),
                    e.entity_name.as_ref().map(|n| n.to_string()),
                )
            })
            .collect();
        let text = entity_text(&parts);
        for value in &entry.values {
            rows.push(vec![
                text.clone(),
                value.key.to_string(),
                value.value.to_string(),
            ]);
        }
        let values: serde_json::Map<String, serde_json::Value> = entry
            .values
            .iter()
            .map(|v| (v.key.to_string(), json!(v.value)))
            .collect();
        let entity: Vec<_> = parts
            .iter()
            .map(|(t, n)| json!({"entity_type": t, "entity_name": n}))
            .collect();
        docs.push(json!({"entity": entity, "values": values}));
    }
    if connect.json {
        out_json(&json!(docs));
    } else if rows.is_empty() {
        out("no client quotas match");
    } else {
        out(&table(&["ENTITY", "KEY", "VALUE"], &rows));
    }
    Ok(())
}

async fn alter(
    connect: &Connect,
    entity: &EntityArgs,
    set: &[String],
    delete: &[String],
    validate_only: bool,
) -> anyhow::Result<()> {
    let parts = entity.parts();
    if parts.is_empty() {
        bail!("no entity: give --user NAME or --user-default, and/or --client-id ID or --client-id-default");
    }
    if set.is_empty() && delete.is_empty() {
        bail!("nothing to change: give --set KEY=VALUE or --delete KEY");
    }
    let mut ops = Vec::new();
    for text in set {
        let (key, value) = key_value(text)?;
        let Ok(value) = value.parse::<f64>() else {
            bail!("{key}={value}: the value is not a number");
        };
        ops.push(
            OpData::default()
                .with_key(str_bytes(&key))
                .with_value(value),
        );
    }
    for key in delete {
        ops.push(OpData::default().with_key(str_bytes(key)).with_remove(true));
    }
    let entity_data = parts
        .iter()
        .map(|(t, n)| {
            EntityData::default()
                .with_entity_type(str_bytes(t))
                .with_entity_name(n.as_deref().map(str_bytes))
        })
        .collect();
    let request = AlterClientQuotasRequest::default()
        .with_entries(vec![EntryData::default()
            .with_entity(entity_data)
            .with_ops(ops)])
        .with_validate_only(validate_only);
    let (mut client, _) = connect.client().await?;
    let response = client.request(VERSION, &request).await?;
    let text = entity_text(
        &parts
            .iter()
            .map(|(t, n)| (t.to_string(), n.clone()))
            .collect::<Vec<_>>(),
    );
    for r in &response.entries {
        check(
            r.error_code,
            || format!("altering the client quotas of {text}"),
            r.error_message.as_ref(),
        )?;
    }
    if connect.json {
        out_json(&json!({
            "entity": text, "set": set, "deleted": delete, "validate_only": validate_only,
        }));
    } else {
        let verb = if validate_only { "would be" } else { "were" };
        out(&format!(
            "{text}: {} quota(s) set and {} removed {verb} accepted",
            set.len(),
            delete.len()
        ));
    }
    Ok(())
}
