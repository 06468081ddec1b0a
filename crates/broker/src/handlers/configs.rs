//! DescribeConfigs (v1–v4), AlterConfigs (v0–v2), IncrementalAlterConfigs (v0–v1).
//!
//! Topic configs are the log's (`TopicConfig`); they can be described and changed. Broker
//! configs are Kafka's standard names filled from this broker's settings: they come from
//! `strata.toml` (or the environment, or flags) and are not dynamically changeable, so altering
//! a broker resource is refused with a message that says where to change it. A broker's logger
//! list (BROKER_LOGGER) is empty: log levels are one process-wide filter. Group configs (GROUP)
//! are stored per group and honoured as `crate::group_configs` says.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strata_log::config::ConfigEntry;
use strata_log::config_table::config_def;
use strata_log::{LogConfig, TopicConfig, TopicInfo};

use super::{refuse_internal, str_bytes};
use crate::authorize::{Authz, Op, Res};
use crate::errors::{code, error_code, message};
use crate::group_configs;
use crate::server::Broker;
use crate::BrokerSettings;
use crate::RequestContext;

/// Kafka's ConfigResource types.
pub(crate) mod resource {
    pub const TOPIC: i8 = 2;
    pub const BROKER: i8 = 4;
    pub const BROKER_LOGGER: i8 = 8;
    pub const CLIENT_METRICS: i8 = 16;
    pub const GROUP: i8 = 32;
}

/// Kafka's ConfigSource values.
mod source {
    pub const TOPIC_CONFIG: i8 = 1;
    pub const STATIC_BROKER_CONFIG: i8 = 4;
    pub const DEFAULT_CONFIG: i8 = 5;
    pub const GROUP_CONFIG: i8 = 8;
}

/// Kafka's ConfigType values (DescribeConfigs v3+).
mod config_type {
    pub const BOOLEAN: i8 = 1;
    pub const STRING: i8 = 2;
    pub const INT: i8 = 3;
    pub const SHORT: i8 = 4;
    pub const LONG: i8 = 5;
    pub const LIST: i8 = 7;
}

/// IncrementalAlterConfigs operations.
mod op {
    pub const SET: i8 = 0;
    pub const DELETE: i8 = 1;
    pub const APPEND: i8 = 2;
    pub const SUBTRACT: i8 = 3;
}

/// A topic's configs as DescribeConfigs and CreateTopics report them.
pub(crate) fn topic_entries(info: &TopicInfo) -> Vec<ConfigEntry> {
    info.config.entries(&info.overrides)
}

pub(crate) fn config_source(entry: &ConfigEntry) -> i8 {
    if entry.is_default {
        source::DEFAULT_CONFIG
    } else {
        source::TOPIC_CONFIG
    }
}

/// A topic config's type comes from the log's table; the rest are this broker's own.
fn type_of(name: &str) -> i8 {
    if let Some(def) = config_def(name) {
        return def.kind.code();
    }
    match name {
        "log.retention.ms"
        | "log.retention.bytes"
        | "connections.max.idle.ms"
        | "queued.max.request.bytes" => config_type::LONG,
        "message.max.bytes"
        | "num.partitions"
        | "node.id"
        | "broker.id"
        | "socket.request.max.bytes"
        | "min.insync.replicas"
        | "max.connections"
        | "max.connections.per.ip"
        | "max.request.partition.size.limit"
        | "offsets.topic.num.partitions"
        | "group.max.size"
        | "group.initial.rebalance.delay.ms"
        | "group.min.session.timeout.ms"
        | "group.max.session.timeout.ms"
        | "consumer.session.timeout.ms"
        | "consumer.heartbeat.interval.ms"
        | "share.session.timeout.ms"
        | "share.heartbeat.interval.ms"
        | "share.record.lock.duration.ms"
        | "share.delivery.count.limit"
        | "share.partition.max.record.locks" => config_type::INT,
        "default.replication.factor" => config_type::SHORT,
        "auto.create.topics.enable" => config_type::BOOLEAN,
        _ => config_type::STRING,
    }
}

/// A topic config's documentation is its row's reason in the log's table (what it does in
/// Strata, or why it does nothing).
fn documentation(name: &str) -> Option<&'static str> {
    config_def(name).map(|def| def.why)
}

/// Kafka's check of a config resource: a topic's configs are the topic's, a broker's (and
/// its loggers') the cluster's.
fn config_authorized(
    authz: &Authz<'_>,
    resource_type: i8,
    name: &str,
    operation: Op,
) -> Result<(), (i16, String)> {
    let (allowed, error) = match resource_type {
        resource::TOPIC => (
            authz.allows(operation, Res::Topic, name),
            code::TOPIC_AUTHORIZATION_FAILED,
        ),
        resource::BROKER | resource::BROKER_LOGGER => (
            authz.allows_cluster(operation),
            code::CLUSTER_AUTHORIZATION_FAILED,
        ),
        resource::GROUP => (
            authz.allows(operation, Res::Group, name),
            code::GROUP_AUTHORIZATION_FAILED,
        ),
        // Refused as unsupported by the caller.
        _ => (true, code::NONE),
    };
    if allowed {
        Ok(())
    } else {
        Err((error, "Authorization failed.".to_string()))
    }
}

pub(crate) async fn describe_configs(
    broker: &Broker,
    request: DescribeConfigsRequest,
    ctx: &RequestContext,
) -> DescribeConfigsResponse {
    let v = ctx.api_version;
    let authz = broker.authz(ctx);
    // Group configs are read from storage first (the rest is in memory).
    let mut groups = BTreeMap::new();
    for res in &request.resources {
        if res.resource_type == resource::GROUP {
            let name = res.resource_name.to_string();
            let read = group_entries(broker, &name).await;
            groups.insert(name, read);
        }
    }
    let results = request
        .resources
        .into_iter()
        .map(|res| {
            let mut result = DescribeConfigsResult::default();
            result.resource_type = res.resource_type;
            result.resource_name = res.resource_name.clone();
            let authorized = config_authorized(
                &authz,
                res.resource_type,
                res.resource_name.as_str(),
                Op::DescribeConfigs,
            );
            let entries: Result<Vec<(ConfigEntry, i8)>, (i16, String)> = match res.resource_type {
                _ if authorized.is_err() => authorized.map(|()| Vec::new()),
                resource::TOPIC => match broker.log.topic(res.resource_name.as_str()) {
                    Some(info) => Ok(topic_entries(&info)
                        .into_iter()
                        .map(|e| {
                            let s = config_source(&e);
                            (e, s)
                        })
                        .collect()),
                    None => Err((
                        code::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("topic {} does not exist", res.resource_name.as_str()),
                    )),
                },
                resource::BROKER => broker_entries(broker, res.resource_name.as_str()),
                // Strata has no per-logger levels to describe (one `--log-level` filter for the
                // process): the broker's logger list is empty, not an error.
                resource::BROKER_LOGGER => {
                    check_broker_name(broker, res.resource_name.as_str()).map(|()| Vec::new())
                }
                resource::GROUP => groups
                    .remove(res.resource_name.as_str())
                    .unwrap_or_else(|| Ok(Vec::new())),
                other => Err((
                    code::INVALID_REQUEST,
                    format!("config resource type {other} is not supported"),
                )),
            };
            match entries {
                Ok(entries) => {
                    result.error_code = code::NONE;
                    result.error_message = None;
                    result.configs = entries
                        .into_iter()
                        .filter(|(e, _)| match &res.configuration_keys {
                            Some(keys) => keys.iter().any(|k| k.as_str() == e.name),
                            None => true,
                        })
                        .map(|(e, src)| {
                            described(
                                e,
                                src,
                                v,
                                request.include_synonyms,
                                request.include_documentation,
                            )
                        })
                        .collect();
                }
                Err((error, text)) => {
                    result.error_code = error;
                    result.error_message = message(text);
                }
            }
            result
        })
        .collect();
    let mut response = DescribeConfigsResponse::default();
    response.results = results;
    response
}

fn described(
    entry: ConfigEntry,
    src: i8,
    v: i16,
    include_synonyms: bool,
    include_documentation: bool,
) -> DescribeConfigsResourceResult {
    let mut c = DescribeConfigsResourceResult::default();
    c.name = str_bytes(entry.name);
    c.value = Some(str_bytes(&entry.value));
    c.read_only = entry.read_only;
    c.config_source = src;
    c.is_sensitive = false;
    if include_synonyms {
        let mut synonym = DescribeConfigsSynonym::default();
        synonym.name = str_bytes(entry.name);
        synonym.value = Some(str_bytes(&entry.value));
        synonym.source = src;
        c.synonyms = vec![synonym];
    }
    if v >= 3 {
        c.config_type = type_of(entry.name);
        c.documentation = if include_documentation {
            documentation(entry.name).map(StrBytes::from_static_str)
        } else {
            None
        };
    }
    c
}

/// This broker's configs under Kafka's standard names, each from the setting it reports. The
/// resource name is the broker id, or empty for the cluster-wide defaults, as in Kafka. None
/// can be changed while the broker runs (all are read-only); a value equal to Strata's default
/// is reported as DEFAULT_CONFIG, any other as STATIC_BROKER_CONFIG (from `strata.toml`, the
/// environment or a flag), since the settings do not record which layer set them.
fn broker_entries(broker: &Broker, name: &str) -> Result<Vec<(ConfigEntry, i8)>, (i16, String)> {
    check_broker_name(broker, name)?;
    let s = &broker.settings;
    let d = BrokerSettings::default();
    let topic = TopicConfig::default();
    let log = broker.log.config();
    let log_defaults = LogConfig::default();
    let ms = |t: std::time::Duration| t.as_millis().to_string();
    let entry = |name: &'static str, value: String, default: Option<String>| {
        let is_default = default.as_ref() == Some(&value);
        (
            ConfigEntry {
                name,
                value,
                is_default,
                read_only: true,
            },
            if is_default {
                source::DEFAULT_CONFIG
            } else {
                source::STATIC_BROKER_CONFIG
            },
        )
    };
    let fixed = |name: &'static str, value: String| entry(name, value, None);
    let default = |name: &'static str, value: String| entry(name, value.clone(), Some(value));
    let setting =
        |name: &'static str, value: String, default: String| entry(name, value, Some(default));
    let me = s.node_id.0.to_string();
    Ok(vec![
        fixed(
            "advertised.listeners",
            format!("PLAINTEXT://{}:{}", s.advertised_host, s.advertised_port),
        ),
        fixed("listeners", s.listeners.clone()),
        fixed("node.id", me.clone()),
        fixed("broker.id", me),
        fixed("log.dirs", s.log_dir.clone()),
        setting(
            "auto.create.topics.enable",
            s.auto_create_topics.to_string(),
            d.auto_create_topics.to_string(),
        ),
        setting(
            "num.partitions",
            log.default_partitions.to_string(),
            log_defaults.default_partitions.to_string(),
        ),
        // Reported only: the storage keeps the one copy whatever the factor says.
        setting(
            "default.replication.factor",
            s.default_replication_factor.to_string(),
            d.default_replication_factor.to_string(),
        ),
        default("min.insync.replicas", "1".to_string()),
        default("log.retention.ms", topic.retention_ms.to_string()),
        default("log.retention.bytes", topic.retention_bytes.to_string()),
        default("message.max.bytes", topic.max_message_bytes.to_string()),
        setting(
            "socket.request.max.bytes",
            s.max_request_bytes.to_string(),
            d.max_request_bytes.to_string(),
        ),
        setting(
            "queued.max.request.bytes",
            s.queued_max_request_bytes.to_string(),
            d.queued_max_request_bytes.to_string(),
        ),
        setting(
            "max.connections",
            s.max_connections.to_string(),
            d.max_connections.to_string(),
        ),
        setting(
            "max.connections.per.ip",
            s.max_connections_per_ip.to_string(),
            d.max_connections_per_ip.to_string(),
        ),
        setting(
            "connections.max.idle.ms",
            ms(s.connections_max_idle),
            ms(d.connections_max_idle),
        ),
        setting(
            "max.request.partition.size.limit",
            s.max_request_partition_size_limit.to_string(),
            d.max_request_partition_size_limit.to_string(),
        ),
        setting(
            "offsets.topic.num.partitions",
            s.group_shards.to_string(),
            d.group_shards.to_string(),
        ),
        setting(
            "group.max.size",
            s.group_max_size.to_string(),
            d.group_max_size.to_string(),
        ),
        setting(
            "group.initial.rebalance.delay.ms",
            ms(s.group_initial_rebalance_delay),
            ms(d.group_initial_rebalance_delay),
        ),
        setting(
            "group.min.session.timeout.ms",
            ms(s.group_min_session_timeout),
            ms(d.group_min_session_timeout),
        ),
        setting(
            "group.max.session.timeout.ms",
            ms(s.group_max_session_timeout),
            ms(d.group_max_session_timeout),
        ),
        setting(
            "group.consumer.migration.policy",
            s.group_consumer_migration_policy.as_str().to_string(),
            d.group_consumer_migration_policy.as_str().to_string(),
        ),
    ])
}

/// A group's configs: the ones it set (GROUP_CONFIG), and the others at the broker's value.
async fn group_entries(
    broker: &Broker,
    group: &str,
) -> Result<Vec<(ConfigEntry, i8)>, (i16, String)> {
    if group.is_empty() {
        return Err((
            code::INVALID_REQUEST,
            "a group config resource needs a group id".into(),
        ));
    }
    let config = broker
        .share
        .configs
        .read(group)
        .await
        .map_err(|e| (crate::errors::group_config_error_code(&e), e.to_string()))?;
    let s = &broker.settings;
    let ms = |d: std::time::Duration| d.as_millis().to_string();
    let honoured = [
        (
            group_configs::SHARE_AUTO_OFFSET_RESET,
            s.share_auto_offset_reset.to_string(),
        ),
        (
            group_configs::SHARE_ISOLATION_LEVEL,
            group_configs::isolation_name(strata_log::Isolation::default()).to_string(),
        ),
        (
            group_configs::SHARE_RECORD_LOCK_DURATION_MS,
            ms(s.group_share_record_lock_duration),
        ),
        (
            group_configs::SHARE_DELIVERY_COUNT_LIMIT,
            s.group_share_delivery_count_limit.to_string(),
        ),
        (
            group_configs::SHARE_PARTITION_MAX_RECORD_LOCKS,
            s.group_share_partition_max_record_locks.to_string(),
        ),
        (
            group_configs::CONSUMER_SESSION_TIMEOUT_MS,
            ms(s.group_consumer_session_timeout),
        ),
        (
            group_configs::CONSUMER_HEARTBEAT_INTERVAL_MS,
            ms(s.group_consumer_heartbeat_interval),
        ),
        (
            group_configs::SHARE_SESSION_TIMEOUT_MS,
            ms(s.group_share_session_timeout),
        ),
        (
            group_configs::SHARE_HEARTBEAT_INTERVAL_MS,
            ms(s.group_share_heartbeat_interval),
        ),
    ];
    let mut out = Vec::new();
    for (name, broker_value) in honoured {
        let (value, src) = match config.values.get(name) {
            Some(v) => (v.clone(), source::GROUP_CONFIG),
            None => (broker_value, source::STATIC_BROKER_CONFIG),
        };
        out.push((
            ConfigEntry {
                name,
                value,
                is_default: src != source::GROUP_CONFIG,
                read_only: false,
            },
            src,
        ));
    }
    Ok(out)
}

/// Validates a group's config changes and applies them (`replace`: AlterConfigs' whole-set
/// semantics).
async fn alter_group(
    broker: &Broker,
    group: &str,
    changes: Vec<(String, Option<String>)>,
    replace: bool,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    if group.is_empty() {
        return Err((
            code::INVALID_REQUEST,
            "a group config resource needs a group id".into(),
        ));
    }
    let invalid = |e: group_configs::GroupConfigError| {
        (crate::errors::group_config_error_code(&e), e.to_string())
    };
    let mut checked = Vec::with_capacity(changes.len());
    for (name, value) in changes {
        let value = match value {
            Some(v) => Some(group_configs::validate(&name, &v).map_err(invalid)?),
            // Removing a config Strata does not keep is refused like setting it.
            None => {
                group_configs::check_name(&name).map_err(invalid)?;
                None
            }
        };
        checked.push((name, value));
    }
    // A heartbeat interval must stay below its session timeout (Kafka's rule), the broker's
    // value standing in for one the group does not set.
    let s = &broker.settings;
    let check = |config: &group_configs::GroupConfig| {
        let pairs = [
            (
                config.consumer_timeouts(),
                s.group_consumer_session_timeout,
                s.group_consumer_heartbeat_interval,
                group_configs::CONSUMER_HEARTBEAT_INTERVAL_MS,
                group_configs::CONSUMER_SESSION_TIMEOUT_MS,
            ),
            (
                config.share_timeouts(),
                s.group_share_session_timeout,
                s.group_share_heartbeat_interval,
                group_configs::SHARE_HEARTBEAT_INTERVAL_MS,
                group_configs::SHARE_SESSION_TIMEOUT_MS,
            ),
        ];
        for (set, session, interval, interval_name, session_name) in pairs {
            let session = set.session.unwrap_or(session);
            let interval = set.heartbeat_interval.unwrap_or(interval);
            if interval >= session {
                return Err(group_configs::GroupConfigError::Invalid(format!(
                    "{interval_name} ({} ms) must be less than {session_name} ({} ms)",
                    interval.as_millis(),
                    session.as_millis()
                )));
            }
        }
        Ok(())
    };
    broker
        .share
        .configs
        .alter(group, &checked, replace, validate_only, check)
        .await
        .map_err(invalid)
}

/// A BROKER or BROKER_LOGGER resource names this broker's id, or is empty (the cluster-wide
/// defaults).
fn check_broker_name(broker: &Broker, name: &str) -> Result<(), (i16, String)> {
    let me = broker.settings.node_id.0;
    if !name.is_empty() && name.parse::<i32>().ok() != Some(me) {
        return Err((
            code::INVALID_REQUEST,
            format!("unexpected broker id {name}; this is broker {me}"),
        ));
    }
    Ok(())
}

fn no_loggers() -> (i16, String) {
    (
        code::INVALID_REQUEST,
        "Strata has no per-logger levels: the log filter is the serve flag --log-level".to_string(),
    )
}

fn broker_is_read_only() -> (i16, String) {
    (
        code::INVALID_REQUEST,
        "broker configs are read-only: change them in strata.toml and restart".to_string(),
    )
}

pub(crate) async fn alter_configs(
    broker: &Broker,
    request: AlterConfigsRequest,
    ctx: &RequestContext,
) -> AlterConfigsResponse {
    let authz = broker.authz(ctx);
    let mut responses = Vec::with_capacity(request.resources.len());
    for res in request.resources {
        let authorized = config_authorized(
            &authz,
            res.resource_type,
            res.resource_name.as_str(),
            Op::AlterConfigs,
        );
        let outcome = match res.resource_type {
            _ if authorized.is_err() => authorized,
            resource::TOPIC => {
                let mut overrides = BTreeMap::new();
                let mut null = None;
                for c in &res.configs {
                    match &c.value {
                        Some(value) => {
                            overrides.insert(c.name.to_string(), value.to_string());
                        }
                        None => null = Some(c.name.to_string()),
                    }
                }
                match (
                    null,
                    refuse_internal(res.resource_name.as_str(), "change configs of"),
                ) {
                    (_, Some(refusal)) => Err(refusal),
                    (Some(name), None) => Err((
                        code::INVALID_CONFIG,
                        format!("config {name} has a null value"),
                    )),
                    (None, None) => broker
                        .log
                        .set_topic_configs(
                            res.resource_name.as_str(),
                            overrides,
                            request.validate_only,
                        )
                        .await
                        .map_err(|e| (error_code(&e), e.to_string())),
                }
            }
            resource::BROKER => Err(broker_is_read_only()),
            resource::BROKER_LOGGER => Err(no_loggers()),
            resource::GROUP => {
                let changes = res
                    .configs
                    .iter()
                    .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
                    .collect();
                alter_group(
                    broker,
                    res.resource_name.as_str(),
                    changes,
                    true,
                    request.validate_only,
                )
                .await
            }
            other => Err((
                code::INVALID_REQUEST,
                format!("config resource type {other} is not supported"),
            )),
        };
        let mut r = alter_configs_response::AlterConfigsResourceResponse::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name;
        (r.error_code, r.error_message) = error_fields(outcome);
        responses.push(r);
    }
    let mut response = AlterConfigsResponse::default();
    response.responses = responses;
    response
}

/// A resource's outcome as the (error code, error message) pair both AlterConfigs responses
/// carry.
fn error_fields(outcome: Result<(), (i16, String)>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (code::NONE, None),
        Err((error, text)) => (error, message(text)),
    }
}

pub(crate) async fn incremental_alter_configs(
    broker: &Broker,
    request: IncrementalAlterConfigsRequest,
    ctx: &RequestContext,
) -> IncrementalAlterConfigsResponse {
    let authz = broker.authz(ctx);
    let mut responses = Vec::with_capacity(request.resources.len());
    for res in request.resources {
        let authorized = config_authorized(
            &authz,
            res.resource_type,
            res.resource_name.as_str(),
            Op::AlterConfigs,
        );
        let outcome = match res.resource_type {
            _ if authorized.is_err() => authorized,
            resource::TOPIC => match broker.log.topic(res.resource_name.as_str()) {
                None => Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("topic {} does not exist", res.resource_name.as_str()),
                )),
                Some(info) => match refuse_internal(&info.name, "change configs of") {
                    Some(refusal) => Err(refusal),
                    None => match incremental_changes(&info, &res.configs) {
                        Err(e) => Err(e),
                        Ok(changes) => broker
                            .log
                            .alter_topic_configs(&info.name, changes, request.validate_only)
                            .await
                            .map_err(|e| (error_code(&e), e.to_string())),
                    },
                },
            },
            resource::BROKER => Err(broker_is_read_only()),
            resource::BROKER_LOGGER => Err(no_loggers()),
            resource::GROUP => match group_changes(&res.configs) {
                Err(e) => Err(e),
                Ok(changes) => {
                    alter_group(
                        broker,
                        res.resource_name.as_str(),
                        changes,
                        false,
                        request.validate_only,
                    )
                    .await
                }
            },
            other => Err((
                code::INVALID_REQUEST,
                format!("config resource type {other} is not supported"),
            )),
        };
        let mut r = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name;
        (r.error_code, r.error_message) = error_fields(outcome);
        responses.push(r);
    }
    let mut response = IncrementalAlterConfigsResponse::default();
    response.responses = responses;
    response
}

/// A config to set (Some) or reset to its default (None).
type ConfigChange = (String, Option<String>);

/// Turns IncrementalAlterConfigs operations into the log's set/delete changes. APPEND and
/// SUBTRACT apply only to list-typed configs (as in Kafka), against the current value.
fn incremental_changes(
    info: &Arc<TopicInfo>,
    configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
) -> Result<Vec<ConfigChange>, (i16, String)> {
    no_repeats(configs)?;
    let current: BTreeMap<&str, String> = topic_entries(info)
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    let mut changes = Vec::with_capacity(configs.len());
    for c in configs {
        let name = c.name.to_string();
        let value = c.value.as_ref().map(|v| v.to_string());
        let change = match c.config_operation {
            op::SET => match value {
                Some(value) => Some(value),
                None => {
                    return Err((
                        code::INVALID_REQUEST,
                        format!("SET of config {name} needs a value"),
                    ))
                }
            },
            op::DELETE => None,
            op::APPEND | op::SUBTRACT => {
                if type_of(&name) != config_type::LIST {
                    return Err((
                        code::INVALID_REQUEST,
                        format!("config {name} is not a list: APPEND and SUBTRACT do not apply"),
                    ));
                }
                let mut items: Vec<String> = current
                    .get(name.as_str())
                    .map(|v| split_list(v))
                    .unwrap_or_default();
                let operand = split_list(value.as_deref().unwrap_or(""));
                if c.config_operation == op::APPEND {
                    for item in operand {
                        if !items.contains(&item) {
                            items.push(item);
                        }
                    }
                } else {
                    items.retain(|item| !operand.contains(item));
                }
                Some(items.join(","))
            }
            other => {
                return Err((
                    code::INVALID_REQUEST,
                    format!("unknown config operation {other}"),
                ))
            }
        };
        changes.push((name, change));
    }
    Ok(changes)
}

/// Kafka refuses an IncrementalAlterConfigs resource naming one config twice.
fn no_repeats(
    configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
) -> Result<(), (i16, String)> {
    let mut seen = std::collections::HashSet::new();
    for c in configs {
        if !seen.insert(c.name.as_str()) {
            return Err((
                code::INVALID_REQUEST,
                format!(
                    "config {} appears more than once in the request",
                    c.name.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// IncrementalAlterConfigs operations on a group: SET and DELETE (no group config is a list,
/// so APPEND and SUBTRACT are refused, as Kafka does for non-list configs).
fn group_changes(
    configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
) -> Result<Vec<ConfigChange>, (i16, String)> {
    no_repeats(configs)?;
    let mut changes = Vec::with_capacity(configs.len());
    for c in configs {
        let name = c.name.to_string();
        let change = match (c.config_operation, &c.value) {
            (op::SET, Some(value)) => Some(value.to_string()),
            (op::SET, None) => {
                return Err((
                    code::INVALID_REQUEST,
                    format!("SET of config {name} needs a value"),
                ))
            }
            (op::DELETE, _) => None,
            (op::APPEND | op::SUBTRACT, _) => {
                return Err((
                    code::INVALID_CONFIG,
                    format!("config {name} is not a list: APPEND and SUBTRACT do not apply"),
                ))
            }
            (other, _) => {
                return Err((
                    code::INVALID_REQUEST,
                    format!("unknown config operation {other}"),
                ))
            }
        };
        changes.push((name, change));
    }
    Ok(changes)
}

fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;

    use super::*;

    fn config(name: &str) -> AlterableConfig {
        let mut c = AlterableConfig::default();
        c.name = StrBytes::from_string(name.to_string());
        c
    }

    #[test]
    fn a_config_named_twice_in_one_resource_is_refused_for_topics_and_groups() {
        assert!(no_repeats(&[config("a"), config("b")]).is_ok());
        let twice = [config("a"), config("b"), config("a")];
        let (error, why) = no_repeats(&twice).unwrap_err();
        assert_eq!(error, code::INVALID_REQUEST);
        assert!(why.contains("config a appears more than once"), "{why}");
        assert_eq!(group_changes(&twice).unwrap_err().0, code::INVALID_REQUEST);
    }
}
