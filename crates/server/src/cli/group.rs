//! `strata group list|describe|lag|reset-offsets|delete`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::bail;
use bytes::Buf;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerProtocolAssignment, DeleteGroupsRequest,
    DescribeGroupsRequest, GroupId, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    ShareGroupDescribeRequest,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use serde_json::json;

use super::topic::{log_offsets, topic_metadata};
use super::{out, out_json, table, Connect};
use crate::kafka_client::{check, name, str_bytes, Client};

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// List the consumer groups of every broker.
    List {
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a group's state and members with their partitions.
    Describe {
        group: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Per partition: the group's committed offset, the log end offset, and the lag between.
    Lag {
        group: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Move a group's committed offsets; prints the plan, and commits it only with --execute.
    ///
    /// Refused while the group has members (stop its consumers first), as Kafka's
    /// kafka-consumer-groups.sh does: a live member would overwrite the new offsets.
    ResetOffsets(ResetArgs),
    /// Delete consumer groups (their committed offsets); refused for groups with members.
    Delete {
        #[arg(required = true)]
        groups: Vec<String>,
        #[command(flatten)]
        connect: Connect,
    },
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["to_earliest", "to_latest", "to_offset", "shift_by"])))]
pub struct ResetArgs {
    group: String,
    #[command(flatten)]
    connect: Connect,
    /// The topic whose offsets to reset (repeatable); all partitions of each.
    #[arg(
        long = "topic",
        value_name = "TOPIC",
        required_unless_present = "all_topics"
    )]
    topics: Vec<String>,
    /// Every topic the group has committed offsets for.
    #[arg(long)]
    all_topics: bool,
    /// To each partition's log start offset.
    #[arg(long)]
    to_earliest: bool,
    /// To each partition's log end offset (skip everything not yet consumed).
    #[arg(long)]
    to_latest: bool,
    /// To this offset (clamped to the partition's log start and end).
    #[arg(long, value_name = "OFFSET")]
    to_offset: Option<i64>,
    /// By this many records from the committed offset, negative to re-consume (clamped).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    shift_by: Option<i64>,
    /// Commit the new offsets; without it only the plan is printed.
    #[arg(long)]
    execute: bool,
}

pub async fn run(command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List { connect } => list(&connect).await,
        GroupCommand::Describe { group, connect } => describe(&connect, &group).await,
        GroupCommand::Lag { group, connect } => lag(&connect, &group).await,
        GroupCommand::ResetOffsets(args) => reset(args).await,
        GroupCommand::Delete { groups, connect } => delete(&connect, &groups).await,
    }
}

fn group_id(text: &str) -> GroupId {
    GroupId(str_bytes(text))
}

/// One group of `strata group list --json` and the console.
#[derive(Debug, serde::Serialize)]
pub struct GroupSummary {
    pub group: String,
    pub state: String,
    /// `classic`, `consumer` (KIP-848) or `share`.
    #[serde(rename = "type")]
    pub kind: String,
    pub protocol_type: String,
}

/// Every group of every broker, by id.
pub async fn group_summaries(client: &mut Client) -> anyhow::Result<Vec<GroupSummary>> {
    // Each broker coordinates the groups of the __consumer_offsets partitions it owns. The live
    // ones only: Metadata also lists brokers that left a moment ago.
    let mut groups = BTreeMap::new();
    for broker in client.live_brokers().await? {
        let response = client
            .node(broker)
            .await?
            .request(5, &ListGroupsRequest::default())
            .await?;
        check(
            response.error_code,
            || format!("listing the groups of broker {broker}"),
            None,
        )?;
        for g in response.groups {
            groups.insert(
                g.group_id.to_string(),
                GroupSummary {
                    group: g.group_id.to_string(),
                    state: g.group_state.to_string(),
                    kind: g.group_type.to_string(),
                    protocol_type: g.protocol_type.to_string(),
                },
            );
        }
    }
    Ok(groups.into_values().collect())
}

async fn list(connect: &Connect) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let groups = group_summaries(&mut client).await?;
    if connect.json {
        out_json(&json!(groups));
    } else {
        let rows: Vec<Vec<String>> = groups
            .iter()
            .map(|g| vec![g.group.clone(), g.state.clone(), g.kind.clone()])
            .collect();
        out(&table(&["GROUP", "STATE", "TYPE"], &rows));
    }
    Ok(())
}

struct Member {
    id: String,
    client_id: String,
    host: String,
    partitions: Vec<(String, Vec<i32>)>,
}

struct Description {
    state: String,
    kind: &'static str,
    protocol: String,
    members: Vec<Member>,
}

/// Describes `group` with whichever protocol it uses: ConsumerGroupDescribe for KIP-848
/// groups, DescribeGroups for classic ones. None if the group does not exist.
async fn describe_group(client: &mut Client, group: &str) -> anyhow::Result<Option<Description>> {
    let mut retry = client.retry();
    loop {
        match describe_group_once(client, group).await {
            // The group's shard is moving or loading: ask again, finding its coordinator anew.
            Err(error) if retry.again(&error).await => {}
            answer => return answer,
        }
    }
}

/// A member as ConsumerGroupDescribe and ShareGroupDescribe both describe it.
fn member(
    id: &StrBytes,
    client_id: &StrBytes,
    host: &StrBytes,
    assignment: impl Iterator<Item = (String, Vec<i32>)>,
) -> Member {
    Member {
        id: id.to_string(),
        client_id: client_id.to_string(),
        host: host.to_string(),
        partitions: assignment.collect(),
    }
}

async fn describe_group_once(
    client: &mut Client,
    group: &str,
) -> anyhow::Result<Option<Description>> {
    let coordinator = client.coordinator(group).await?;
    let request = ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
    // Brokers without KIP-848 do not offer it; they describe every group the classic way.
    if let Ok(response) = coordinator.request(0, &request).await {
        if let Some(g) = response.groups.first() {
            if g.error_code == 0 {
                let members = g
                    .members
                    .iter()
                    .map(|m| {
                        let topics = m.assignment.topic_partitions.iter();
                        member(
                            &m.member_id,
                            &m.client_id,
                            &m.client_host,
                            topics.map(|t| (t.topic_name.to_string(), t.partitions.clone())),
                        )
                    })
                    .collect();
                return Ok(Some(Description {
                    state: g.group_state.to_string(),
                    kind: "consumer",
                    protocol: g.assignor_name.to_string(),
                    members,
                }));
            }
        }
    }
    // A share group (KIP-932) answers only ShareGroupDescribe; brokers without share groups
    // do not offer it.
    let request = ShareGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
    if let Ok(response) = coordinator.request(1, &request).await {
        if let Some(g) = response.groups.first().filter(|g| g.error_code == 0) {
            let members = g
                .members
                .iter()
                .map(|m| {
                    let topics = m.assignment.topic_partitions.iter();
                    member(
                        &m.member_id,
                        &m.client_id,
                        &m.client_host,
                        topics.map(|t| (t.topic_name.to_string(), t.partitions.clone())),
                    )
                })
                .collect();
            return Ok(Some(Description {
                state: g.group_state.to_string(),
                kind: "share",
                protocol: g.assignor_name.to_string(),
                members,
            }));
        }
    }
    let request = DescribeGroupsRequest::default().with_groups(vec![group_id(group)]);
    let response = coordinator.request(5, &request).await?;
    let Some(g) = response.groups.first() else {
        bail!("DescribeGroups answered nothing about group {group:?}");
    };
    if ResponseError::try_from_code(g.error_code) == Some(ResponseError::GroupIdNotFound) {
        return Ok(None);
    }
    check(
        g.error_code,
        || format!("describing group {group:?}"),
        g.error_message.as_ref(),
    )?;
    if g.group_state.as_str() == "Dead" {
        return Ok(None);
    }
    let members = g
        .members
        .iter()
        .map(|m| {
            let mut assignment = m.member_assignment.clone();
            // A consumer's assignment is a version then the struct; other protocols' bytes
            // (Connect, streams) mean nothing here.
            let partitions =
                if g.protocol_type.as_str() == "consumer" && assignment.remaining() >= 2 {
                    let version = assignment.get_i16();
                    ConsumerProtocolAssignment::decode(&mut assignment, version.clamp(0, 3))
                        .map(|a| {
                            a.assigned_partitions
                                .into_iter()
                                .map(|tp| (tp.topic.to_string(), tp.partitions))
                                .collect()
                        })
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
            Member {
                id: m.member_id.to_string(),
                client_id: m.client_id.to_string(),
                host: m.client_host.to_string(),
                partitions,
            }
        })
        .collect();
    Ok(Some(Description {
        state: g.group_state.to_string(),
        kind: "classic",
        protocol: g.protocol_data.to_string(),
        members,
    }))
}

/// `strata group describe --json` and the console's view of a group's members.
#[derive(Debug, serde::Serialize)]
pub struct GroupDescription {
    pub group: String,
    pub state: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

#[derive(Debug, serde::Serialize)]
pub struct MemberDescription {
    pub member_id: String,
    pub client_id: String,
    pub host: String,
    pub assignment: Vec<TopicAssignment>,
}

#[derive(Debug, serde::Serialize)]
pub struct TopicAssignment {
    pub topic: String,
    pub partitions: Vec<i32>,
}

impl GroupDescription {
    fn new(group: &str, description: &Description) -> Self {
        Self {
            group: group.to_string(),
            state: description.state.clone(),
            kind: description.kind,
            protocol: description.protocol.clone(),
            members: description
                .members
                .iter()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    client_id: m.client_id.clone(),
                    host: m.host.clone(),
                    assignment: m
                        .partitions
                        .iter()
                        .map(|(topic, partitions)| TopicAssignment {
                            topic: topic.clone(),
                            partitions: partitions.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The members of `group` and what each is assigned; None if the group does not exist.
pub async fn describe_group_view(
    client: &mut Client,
    group: &str,
) -> anyhow::Result<Option<GroupDescription>> {
    Ok(describe_group(client, group)
        .await?
        .map(|d| GroupDescription::new(group, &d)))
}

fn unknown_group(group: &str) -> anyhow::Error {
    anyhow::anyhow!("group {group:?} does not exist (strata group list shows the groups)")
}

async fn describe(connect: &Connect, group: &str) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let description = describe_group(&mut client, group)
        .await?
        .ok_or_else(|| unknown_group(group))?;
    let assigned = |m: &Member| {
        m.partitions
            .iter()
            .map(|(t, ps)| {
                let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
                format!("{t}:{}", ps.join(","))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if connect.json {
        out_json(&json!(GroupDescription::new(group, &description)));
        return Ok(());
    }
    let mut text = format!(
        "group {group}: {} ({} protocol{}), {} members\n",
        description.state,
        description.kind,
        if description.protocol.is_empty() {
            String::new()
        } else {
            format!(", assignor {}", description.protocol)
        },
        description.members.len()
    );
    if !description.members.is_empty() {
        let rows: Vec<Vec<String>> = description
            .members
            .iter()
            .map(|m| {
                vec![
                    m.id.clone(),
                    m.client_id.clone(),
                    m.host.clone(),
                    assigned(m),
                ]
            })
            .collect();
        text.push('\n');
        text.push_str(&table(
            &["MEMBER", "CLIENT-ID", "HOST", "PARTITIONS"],
            &rows,
        ));
    }
    out(&text);
    Ok(())
}

/// The group's committed offsets: topic → partition → offset.
pub(crate) async fn committed(
    client: &mut Client,
    group: &str,
) -> anyhow::Result<BTreeMap<String, BTreeMap<i32, i64>>> {
    let mut retry = client.retry();
    loop {
        match committed_once(client, group).await {
            Err(error) if retry.again(&error).await => {}
            answer => return answer,
        }
    }
}

async fn committed_once(
    client: &mut Client,
    group: &str,
) -> anyhow::Result<BTreeMap<String, BTreeMap<i32, i64>>> {
    let request = OffsetFetchRequest::default()
        .with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(group_id(group))
            .with_topics(None)])
        .with_require_stable(true);
    let response = client
        .coordinator(group)
        .await?
        .request(8, &request)
        .await?;
    let mut offsets: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
    for g in &response.groups {
        check(g.error_code, || format!("offsets of group {group:?}"), None)?;
        for t in &g.topics {
            for p in &t.partitions {
                check(
                    p.error_code,
                    || {
                        format!(
                            "offset of group {group:?} on {}-{}",
                            t.name.as_str(),
                            p.partition_index
                        )
                    },
                    None,
                )?;
                if p.committed_offset >= 0 {
                    offsets
                        .entry(t.name.to_string())
                        .or_default()
                        .insert(p.partition_index, p.committed_offset);
                }
            }
        }
    }
    Ok(offsets)
}

/// Log start and end of every partition of `topic`.
pub(crate) async fn topic_offsets(
    client: &mut Client,
    topic: &str,
) -> anyhow::Result<BTreeMap<i32, (i64, i64)>> {
    let metadata = topic_metadata(client, topic).await?;
    let leaders: Vec<(i32, i32)> = metadata
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect();
    log_offsets(client, topic, &leaders).await
}

/// `strata group lag --json` and the console's lag of a group.
#[derive(Debug, serde::Serialize)]
pub struct GroupLag {
    pub group: String,
    pub partitions: Vec<PartitionLag>,
    pub total_lag: i64,
}

#[derive(Debug, serde::Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub committed_offset: i64,
    pub log_end_offset: i64,
    pub lag: i64,
}

/// Committed offset, log end offset and lag of every partition `group` committed for.
pub async fn group_lag(client: &mut Client, group: &str) -> anyhow::Result<GroupLag> {
    let committed = committed(client, group).await?;
    if committed.is_empty() && describe_group(client, group).await?.is_none() {
        return Err(unknown_group(group));
    }
    let mut partitions = Vec::new();
    for (topic, offsets) in &committed {
        let ends = topic_offsets(client, topic).await?;
        for (&partition, &offset) in offsets {
            let end = ends.get(&partition).map_or(-1, |(_, end)| *end);
            partitions.push(PartitionLag {
                topic: topic.clone(),
                partition,
                committed_offset: offset,
                log_end_offset: end,
                lag: (end - offset).max(0),
            });
        }
    }
    let total_lag = partitions.iter().map(|p| p.lag).sum();
    Ok(GroupLag {
        group: group.to_string(),
        partitions,
        total_lag,
    })
}

async fn lag(connect: &Connect, group: &str) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let lag = group_lag(&mut client, group).await?;
    if connect.json {
        out_json(&json!(lag));
    } else {
        let cells: Vec<Vec<String>> = lag
            .partitions
            .iter()
            .map(|p| {
                vec![
                    p.topic.clone(),
                    p.partition.to_string(),
                    p.committed_offset.to_string(),
                    p.log_end_offset.to_string(),
                    p.lag.to_string(),
                ]
            })
            .collect();
        let mut text = table(
            &["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG"],
            &cells,
        );
        text.push_str(&format!("\ntotal lag: {}\n", lag.total_lag));
        out(&text);
    }
    Ok(())
}

async fn reset(args: ResetArgs) -> anyhow::Result<()> {
    let group = args.group.as_str();
    let (mut client, _) = args.connect.client().await?;
    if let Some(description) = describe_group(&mut client, group).await? {
        if !description.members.is_empty() {
            bail!(
                "group {group:?} has {} active member(s) ({}); stop its consumers first, or the \
                 offsets they commit would overwrite the reset",
                description.members.len(),
                description.state
            );
        }
    }
    let current = committed(&mut client, group).await?;
    let topics: BTreeSet<String> = if args.all_topics {
        current.keys().cloned().collect()
    } else {
        args.topics.iter().cloned().collect()
    };
    if topics.is_empty() {
        bail!("group {group:?} has committed no offsets; name the topics with --topic");
    }
    let mut plan = Vec::new();
    for topic in &topics {
        let offsets = topic_offsets(&mut client, topic).await?;
        for (&partition, &(start, end)) in &offsets {
            let now = current.get(topic).and_then(|p| p.get(&partition)).copied();
            let wanted = if args.to_earliest {
                start
            } else if args.to_latest {
                end
            } else if let Some(offset) = args.to_offset {
                offset
            } else if let Some(shift) = args.shift_by {
                now.unwrap_or(start).saturating_add(shift)
            } else {
                bail!("give one of --to-earliest, --to-latest, --to-offset, --shift-by");
            };
            plan.push((topic.clone(), partition, now, wanted.clamp(start, end)));
        }
    }
    if args.execute {
        let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (topic, partition, _, new) in &plan {
            by_topic.entry(topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*partition)
                    .with_committed_offset(*new)
                    .with_committed_leader_epoch(-1),
            );
        }
        // Generation -1 and no member id: the commit of a tool, accepted only while the
        // group has no members.
        let request = OffsetCommitRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default()
                            .with_name(name(t))
                            .with_partitions(ps)
                    })
                    .collect(),
            );
        let response = client
            .coordinator(group)
            .await?
            .request(8, &request)
            .await?;
        for t in &response.topics {
            for p in &t.partitions {
                check(
                    p.error_code,
                    || {
                        format!(
                            "committing group {group:?}'s offset of {}-{}",
                            t.name.as_str(),
                            p.partition_index
                        )
                    },
                    None,
                )?;
            }
        }
    }
    if args.connect.json {
        let partitions: Vec<_> = plan
            .iter()
            .map(|(t, p, now, new)| json!({"topic": t, "partition": p, "current_offset": now, "new_offset": new}))
            .collect();
        out_json(&json!({"group": group, "executed": args.execute, "partitions": partitions}));
    } else {
        let rows: Vec<Vec<String>> = plan
            .iter()
            .map(|(t, p, now, new)| {
                vec![
                    t.clone(),
                    p.to_string(),
                    now.map_or("-".into(), |o| o.to_string()),
                    new.to_string(),
                ]
            })
            .collect();
        let mut text = table(&["TOPIC", "PARTITION", "CURRENT", "NEW"], &rows);
        text.push_str(if args.execute {
            "\noffsets committed\n"
        } else {
            "\ndry run: nothing committed (add --execute to commit these offsets)\n"
        });
        out(&text);
    }
    Ok(())
}

async fn delete(connect: &Connect, groups: &[String]) -> anyhow::Result<()> {
    let (mut client, _) = connect.client().await?;
    let mut failed = Vec::new();
    for group in groups {
        let request = DeleteGroupsRequest::default().with_groups_names(vec![group_id(group)]);
        let response = client
            .coordinator(group)
            .await?
            .request(2, &request)
            .await?;
        for r in &response.results {
            let result = match ResponseError::try_from_code(r.error_code) {
                Some(ResponseError::GroupIdNotFound) => Err(unknown_group(group)),
                Some(ResponseError::NonEmptyGroup) => Err(anyhow::anyhow!(
                    "group {group:?} has active members; stop its consumers first"
                )),
                _ => check(r.error_code, || format!("deleting group {group:?}"), None)
                    .map_err(anyhow::Error::from),
            };
            match result {
                Ok(()) if !connect.json => out(&format!("deleted group {group}")),
                Ok(()) => {}
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    if connect.json {
        out_json(&json!({"deleted": groups}));
    }
    Ok(())
}
