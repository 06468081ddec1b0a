//! `strata topic list|create|describe|alter-config|delete|add-partitions`.

use std::collections::{BTreeMap, HashMap};

use anyhow::bail;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    IncrementalAlterConfigsRequest, ListOffsetsRequest,
};
use serde_json::json;

use super::{key_value, out, out_json, table, Connect};
use crate::kafka_client::{check, name, no_leader, str_bytes, Client, ClientError};

const TOPIC_RESOURCE: i8 = 2;
/// How long the broker may take to create, delete or grow a topic.
const ADMIN_TIMEOUT_MS: i32 = 30_000;

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// List the topics (internal ones such as __consumer_offsets with --all).
    List {
        #[command(flatten)]
        connect: Connect,
        /// Include internal topics.
        #[arg(long)]
        all: bool,
    },
    /// Create a topic.
    Create {
        topic: String,
        #[command(flatten)]
        connect: Connect,
        /// Number of partitions [default: the broker's log.default_partitions].
        #[arg(long, value_name = "N")]
        partitions: Option<i32>,
        /// Replication factor reported to clients [default: the broker's
        /// default_replication_factor]; the storage keeps one durable copy whatever it is.
        #[arg(long, value_name = "N")]
        replication_factor: Option<i16>,
        /// A topic config, e.g. retention.ms=86400000 (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Show a topic's partitions (leader, replicas, log start and end offsets) and configs.
    Describe {
        topic: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Set or remove topic configs (IncrementalAlterConfigs).
    AlterConfig {
        topic: String,
        #[command(flatten)]
        connect: Connect,
        /// Set a config, e.g. retention.ms=3600000 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Return a config to its default (repeatable).
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
    /// Delete topics and all their records.
    Delete {
        #[arg(required = true)]
        topics: Vec<String>,
        #[command(flatten)]
        connect: Connect,
    },
    /// Grow a topic to a number of partitions (partitions cannot be removed).
    AddPartitions {
        topic: String,
        #[command(flatten)]
        connect: Connect,
        /// The total number of partitions the topic should have.
        #[arg(long, value_name = "N")]
        partitions: i32,
    },
}

pub async fn run(command: TopicCommand) -> anyhow::Result<()> {
    match command {
        TopicCommand::List { connect, all } => list(&connect, all).await,
        TopicCommand::Create {
            topic,
            connect,
            partitions,
            replication_factor,
            configs,
        } => create(&connect, &topic, partitions, replication_factor, &configs).await,
        TopicCommand::Describe { topic, connect } => describe(&connect, &topic).await,
        TopicCommand::AlterConfig {
            topic,
            connect,
            set,
            delete,
        } => alter_config(&connect, &topic, &set, &delete).await,
        TopicCommand::Delete { topics, connect } => delete_topics(&connect, &topics).await,
        TopicCommand::AddPartitions {
            topic,
            connect,
            partitions,
        } => add_partitions(&connect, &topic, partitions).await,
    }
}

/// One topic of `strata topic list --json` and the console's topic list.
#[derive(Debug, serde::Serialize)]
pub struct TopicSummary {
    pub name: String,
    pub id: String,
    pub partitions: usize,
    pub internal: bool,
}

/// The cluster's topics by name; internal ones only with `all`.
pub async fn topic_summaries(client: &mut Client, all: bool) -> anyhow::Result<Vec<TopicSummary>> {
    let metadata = client.metadata(None).await?;
    let mut topics: Vec<TopicSummary> = metadata
        .topics
        .iter()
        .filter(|t| all || !t.is_internal)
        .map(|t| TopicSummary {
            name: t.name.as_ref().map(|n| n.to_string()).unwrap_or_default(),
            id: t.topic_id.to_string(),
            partitions: t.partitions.len(),
            internal: t.is_internal,
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(topics)
}

async fn list(connect: &Connect, all: bool) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let topics = topic_summaries(&mut client, all).await?;
    if connect.json {
        out_json(&json!(topics));
    } else {
        let rows: Vec<Vec<String>> = topics
            .iter()
            .map(|t| vec![t.name.clone(), t.partitions.to_string()])
            .collect();
        out(&table(&["TOPIC", "PARTITIONS"], &rows));
    }
    Ok(())
}

/// What CreateTopics answered for a new topic.
#[derive(Debug, serde::Serialize)]
pub struct CreatedTopic {
    pub name: String,
    pub id: String,
    pub partitions: i32,
    pub replication_factor: i16,
}

/// Creates `topic` (partitions and replication factor: None for the broker's default) with
/// `configs`, answering once the broker has (which is once every partition has a leader).
pub async fn create_topic(
    client: &mut Client,
    topic: &str,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    configs: &[(String, String)],
) -> anyhow::Result<CreatedTopic> {
    let mut creatable = CreatableTopic::default()
        .with_name(name(topic))
        .with_num_partitions(partitions.unwrap_or(-1))
        .with_replication_factor(replication_factor.unwrap_or(-1));
    for (key, value) in configs {
        creatable.configs.push(
            CreatableTopicConfig::default()
                .with_name(str_bytes(key))
                .with_value(Some(str_bytes(value))),
        );
    }
    let request = CreateTopicsRequest::default()
        .with_topics(vec![creatable])
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let response = client.request(7, &request).await?;
    let result = response
        .topics
        .first()
        .ok_or_else(|| anyhow::anyhow!("CreateTopics answered no result for {topic:?}"))?;
    if ResponseError::try_from_code(result.error_code) == Some(ResponseError::TopicAlreadyExists) {
        bail!("topic {topic:?} already exists (strata topic describe {topic} shows it)");
    }
    check(
        result.error_code,
        || format!("creating topic {topic:?}"),
        result.error_message.as_ref(),
    )?;
    Ok(CreatedTopic {
        name: topic.to_string(),
        id: result.topic_id.to_string(),
        partitions: result.num_partitions,
        replication_factor: result.replication_factor,
    })
}

async fn create(
    connect: &Connect,
    topic: &str,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    configs: &[String],
) -> anyhow::Result<()> {
    let configs = configs
        .iter()
        .map(|c| key_value(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (mut client, _) = connect.client().await?;
    let created =
        create_topic(&mut client, topic, partitions, replication_factor, &configs).await?;
    if connect.json {
        out_json(&json!(created));
    } else {
        out(&format!(
            "created topic {topic} with {} partitions",
            created.partitions
        ));
    }
    Ok(())
}

/// The Metadata of one topic; an unknown topic is an error that says how to see the others.
pub async fn topic_metadata(
    client: &mut Client,
    topic: &str,
) -> anyhow::Result<MetadataResponseTopic> {
    let metadata = client.metadata(Some(&[topic.to_string()])).await?;
    let found = metadata
        .topics
        .into_iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic))
        .ok_or_else(|| anyhow::anyhow!("Metadata answered nothing about topic {topic:?}"))?;
    if ResponseError::try_from_code(found.error_code)
        == Some(ResponseError::UnknownTopicOrPartition)
    {
        bail!("topic {topic:?} does not exist (strata topic list shows the topics)");
    }
    check(found.error_code, || format!("topic {topic:?}"), None)?;
    Ok(found)
}

/// Log start and log end offset of each of `partitions` (index → leader), asking each
/// partition's leader. A partition that moves meanwhile is asked again of its new leader.
pub async fn log_offsets(
    client: &mut Client,
    topic: &str,
    partitions: &[(i32, i32)],
) -> anyhow::Result<BTreeMap<i32, (i64, i64)>> {
    let mut retry = client.retry();
    let mut leaders = partitions.to_vec();
    loop {
        match log_offsets_once(client, topic, &leaders).await {
            Err(error) if retry.again(&error).await => {
                let metadata = topic_metadata(client, topic).await?;
                for (partition, leader) in &mut leaders {
                    *leader = metadata
                        .partitions
                        .iter()
                        .find(|p| p.partition_index == *partition)
                        .map_or(-1, |p| p.leader_id.0);
                }
            }
            answer => return answer,
        }
    }
}

async fn log_offsets_once(
    client: &mut Client,
    topic: &str,
    partitions: &[(i32, i32)],
) -> anyhow::Result<BTreeMap<i32, (i64, i64)>> {
    let mut by_leader: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(partition, leader) in partitions {
        if leader < 0 {
            return Err(no_leader(topic, partition).into());
        }
        by_leader.entry(leader).or_default().push(partition);
    }
    let mut offsets = BTreeMap::new();
    for (leader, indexes) in by_leader {
        let mut found: [HashMap<i32, i64>; 2] = [HashMap::new(), HashMap::new()];
        // -2 earliest, -1 latest: one request each (a request names a partition once).
        for (slot, timestamp) in [(0usize, -2i64), (1, -1)] {
            let request = ListOffsetsRequest::default()
                .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(name(topic))
                    .with_partitions(
                        indexes
                            .iter()
                            .map(|&p| {
                                ListOffsetsPartition::default()
                                    .with_partition_index(p)
                                    .with_current_leader_epoch(-1)
                                    .with_timestamp(timestamp)
                            })
                            .collect(),
                    )]);
            let response = client.node(leader).await?.request(7, &request).await?;
            for t in &response.topics {
                for p in &t.partitions {
                    check(
                        p.error_code,
                        || format!("offsets of {topic}-{}", p.partition_index),
                        None,
                    )?;
                    found[slot].insert(p.partition_index, p.offset);
                }
            }
        }
        for p in indexes {
            let start = found[0].get(&p).copied().unwrap_or(-1);
            let end = found[1].get(&p).copied().unwrap_or(-1);
            offsets.insert(p, (start, end));
        }
    }
    Ok(offsets)
}

fn config_source(source: i8) -> &'static str {
    match source {
        1 => "topic",
        2..=4 => "broker",
        5 => "default",
        _ => "other",
    }
}

/// `strata topic describe --json`, and what the console shows of a topic.
#[derive(Debug, serde::Serialize)]
pub struct TopicDescription {
    pub name: String,
    pub id: String,
    pub internal: bool,
    pub partitions: Vec<PartitionDescription>,
    /// Every config, by name; sensitive values are null.
    pub configs: BTreeMap<String, ConfigValue>,
}

#[derive(Debug, serde::Serialize)]
pub struct PartitionDescription {
    pub partition: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
}

#[derive(Debug, serde::Serialize)]
pub struct ConfigValue {
    pub value: Option<String>,
    /// `topic`, `broker`, `default` or `other`: where the value comes from.
    pub source: &'static str,
}

/// Metadata, log offsets and configs of `topic`.
pub async fn describe_topic(client: &mut Client, topic: &str) -> anyhow::Result<TopicDescription> {
    let metadata = topic_metadata(client, topic).await?;
    let mut partitions = metadata.partitions.clone();
    partitions.sort_by_key(|p| p.partition_index);
    let leaders: Vec<(i32, i32)> = partitions
        .iter()
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect();
    let offsets = log_offsets(client, topic, &leaders).await?;
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(str_bytes(topic))
            // None: every config (an empty list would ask for none).
            .with_configuration_keys(None)]);
    let response = client.request(4, &request).await?;
    let mut configs = BTreeMap::new();
    for result in &response.results {
        check(
            result.error_code,
            || format!("configs of topic {topic:?}"),
            result.error_message.as_ref(),
        )?;
        for c in &result.configs {
            let value = if c.is_sensitive {
                None
            } else {
                c.value.as_ref().map(|v| v.to_string())
            };
            let source = config_source(c.config_source);
            configs.insert(c.name.to_string(), ConfigValue { value, source });
        }
    }
    let ids = |nodes: &[kafka_protocol::messages::BrokerId]| -> Vec<i32> {
        nodes.iter().map(|n| n.0).collect()
    };
    let partitions = partitions
        .iter()
        .map(|p| {
            let (start, end) = offsets.get(&p.partition_index).copied().unwrap_or((-1, -1));
            PartitionDescription {
                partition: p.partition_index,
                leader: p.leader_id.0,
                leader_epoch: p.leader_epoch,
                replicas: ids(&p.replica_nodes),
                isr: ids(&p.isr_nodes),
                log_start_offset: start,
                log_end_offset: end,
            }
        })
        .collect();
    Ok(TopicDescription {
        name: topic.to_string(),
        id: metadata.topic_id.to_string(),
        internal: metadata.is_internal,
        partitions,
        configs,
    })
}

async fn describe(connect: &Connect, topic: &str) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let described = describe_topic(&mut client, topic).await?;
    if connect.json {
        out_json(&json!(described));
        return Ok(());
    }
    let join = |nodes: &[i32]| {
        nodes
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let rows: Vec<Vec<String>> = described
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.partition.to_string(),
                p.leader.to_string(),
                join(&p.replicas),
                join(&p.isr),
                p.log_start_offset.to_string(),
                p.log_end_offset.to_string(),
            ]
        })
        .collect();
    let mut text = format!(
        "topic {topic} (id {}), {} partitions\n\n",
        described.id,
        described.partitions.len()
    );
    text.push_str(&table(
        &[
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "ISR",
            "LOG-START",
            "LOG-END",
        ],
        &rows,
    ));
    // The defaults are many and the same for every topic: a person wants what differs.
    let set: Vec<Vec<String>> = described
        .configs
        .iter()
        .filter(|(_, c)| c.source != "default")
        .map(|(k, c)| {
            vec![
                k.clone(),
                c.value.clone().unwrap_or_default(),
                c.source.to_string(),
            ]
        })
        .collect();
    if set.is_empty() {
        text.push_str("\nno configs set (every config at its default; --json lists them all)\n");
    } else {
        text.push('\n');
        text.push_str(&table(&["CONFIG", "VALUE", "SOURCE"], &set));
    }
    out(&text);
    Ok(())
}

async fn alter_config(
    connect: &Connect,
    topic: &str,
    set: &[String],
    delete: &[String],
) -> anyhow::Result<()> {
    if set.is_empty() && delete.is_empty() {
        bail!("nothing to change: give --set KEY=VALUE or --delete KEY");
    }
    let mut changes = Vec::new();
    for text in set {
        let (key, value) = key_value(text)?;
        changes.push(
            AlterableConfig::default()
                .with_name(str_bytes(&key))
                .with_config_operation(0)
                .with_value(Some(str_bytes(&value))),
        );
    }
    for key in delete {
        changes.push(
            AlterableConfig::default()
                .with_name(str_bytes(key))
                .with_config_operation(1),
        );
    }
    let (mut client, _) = connect.client().await?;
    // Metadata first: an unknown topic gets the error that says what to do.
    topic_metadata(&mut client, topic).await?;
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(str_bytes(topic))
            .with_configs(changes),
    ]);
    let response = client.request(1, &request).await?;
    for r in &response.responses {
        check(
            r.error_code,
            || format!("changing configs of topic {topic:?}"),
            r.error_message.as_ref(),
        )?;
    }
    if connect.json {
        out_json(&json!({"name": topic, "set": set, "deleted": delete}));
    } else {
        out(&format!(
            "topic {topic}: {} config(s) set, {} returned to default",
            set.len(),
            delete.len()
        ));
    }
    Ok(())
}

async fn delete_topics(connect: &Connect, topics: &[String]) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let request = DeleteTopicsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|t| DeleteTopicState::default().with_name(Some(name(t))))
                .collect(),
        )
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let response = client.request(6, &request).await?;
    let mut failed = Vec::new();
    for r in &response.responses {
        let topic = r.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
        let result = if ResponseError::try_from_code(r.error_code)
            == Some(ResponseError::UnknownTopicOrPartition)
        {
            Err(ClientError::NotFound(format!(
                "topic {topic:?} does not exist (strata topic list shows the topics)"
            )))
        } else {
            check(
                r.error_code,
                || format!("deleting topic {topic:?}"),
                r.error_message.as_ref(),
            )
        };
        if let Err(e) = result {
            failed.push(e.to_string());
        } else if !connect.json {
            out(&format!("deleted topic {topic}"));
        }
    }
    if connect.json && failed.is_empty() {
        out_json(&json!({"deleted": topics}));
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

async fn add_partitions(connect: &Connect, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let before = topic_metadata(&mut client, topic).await?.partitions.len();
    let request = CreatePartitionsRequest::default()
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(name(topic))
            .with_count(partitions)
            // None: the broker places the new partitions (an empty list is zero assignments).
            .with_assignments(None)])
        .with_timeout_ms(ADMIN_TIMEOUT_MS);
    let response = client.request(3, &request).await?;
    for r in &response.results {
        check(
            r.error_code,
            || format!("growing topic {topic:?} from {before} to {partitions} partitions"),
            r.error_message.as_ref(),
        )?;
    }
    if connect.json {
        out_json(&json!({"name": topic, "partitions_before": before, "partitions": partitions}));
    } else {
        out(&format!(
            "topic {topic} grown from {before} to {partitions} partitions"
        ));
    }
    Ok(())
}
