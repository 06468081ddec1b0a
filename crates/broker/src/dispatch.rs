//! From a request frame to a reply: header, version check, decode, handler, encode.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, HeaderVersion};
use strata_wire::frame::{parse_request_header, RequestApi};
use tokio::sync::watch;
use tracing::{debug, error, warn};

use crate::api_versions;
use crate::error_codes::{ErrorCodes, ThrottleTime};
use crate::errors::code;
use crate::framing::{encode_response, EncodeError, ResponseFrame};
use crate::handlers;
use crate::quotas::{busy, QuotaKind};
use crate::server::Broker;
use crate::RequestContext;

/// What the connection does with a finished request.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Write this response.
    Frame(ResponseFrame),
    /// No response (acks=0 produce).
    Nothing,
    /// A response over a client quota (or none, for acks=0): write it if any, then do not
    /// read the connection for `mute` (Kafka's channel muting).
    Throttled {
        frame: Option<ResponseFrame>,
        mute: std::time::Duration,
    },
    /// Close the connection once earlier responses are written: a request the protocol gives
    /// no way to refuse, or a failed acks=0 produce (closing is how Kafka tells such a producer
    /// to refresh its metadata).
    Close,
}

/// Handles one request frame and counts it in the broker's per-API traffic (the API key is
/// the frame's first two bytes; a frame too short for one is refused without being counted).
pub(crate) async fn handle_frame(
    broker: Arc<Broker>,
    frame: Bytes,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    produce_turn: Option<crate::ProduceTurn>,
    principal: Arc<crate::security::Principal>,
    listener: Arc<crate::security::Listener>,
) -> Reply {
    let started = broker.clock.monotonic();
    let api_key = frame
        .get(..2)
        .map(|key| i16::from_be_bytes([key[0], key[1]]));
    let reply = handle_request(
        Arc::clone(&broker),
        frame,
        peer,
        shutdown,
        produce_turn,
        principal,
        listener,
    )
    .await;
    if let Some(api_key) = api_key {
        let elapsed = broker.clock.monotonic().saturating_sub(started);
        broker
            .traffic
            .request(api_key, elapsed, matches!(reply, Reply::Close));
    }
    reply
}

/// Handles one request frame. Never panics on client input; every refusal is logged with what
/// we know about the request.
async fn handle_request(
    broker: Arc<Broker>,
    mut frame: Bytes,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    produce_turn: Option<crate::ProduceTurn>,
    principal: Arc<crate::security::Principal>,
    listener: Arc<crate::security::Listener>,
) -> Reply {
    let header = match parse_request_header(&mut frame) {
        Ok(header) => header,
        Err(e) => {
            warn!(%peer, error = %e, "unreadable request header; closing connection");
            return Reply::Close;
        }
    };
    let ctx = RequestContext {
        api_version: header.api_version,
        correlation_id: header.correlation_id,
        client_id: header.client_id().map(str::to_string),
        peer,
        shutdown,
        produce_turn: Arc::new(std::sync::Mutex::new(produce_turn)),
        principal,
        listener,
        errors: Arc::default(),
        busy: Arc::new(busy::BusyMeter::new(Arc::clone(&broker.clock))),
    };
    let api_key = header.api_key;
    let reply = busy::measured(&ctx.busy, answer(&broker, header, frame, &ctx)).await;
    // What the request cost after its response was built (or all of it, for a request
    // answered without one) still counts, without throttling this answer; SASL exchanges
    // are never charged, as in Kafka.
    let sasl = matches!(
        ApiKey::try_from(api_key),
        Ok(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate)
    );
    let rest = ctx.busy.take_uncharged();
    if !sasl && !rest.is_zero() {
        broker.quotas.record_unthrottled(
            QuotaKind::Request,
            &ctx.principal.name,
            ctx.client_id.as_deref().unwrap_or(""),
            rest.as_secs_f64() * 100.0,
        );
    }
    broker.traffic.errors(api_key, &ctx.errors.take());
    reply
}

/// Answers a request whose header was read.
async fn answer(
    broker: &Broker,
    header: strata_wire::frame::RequestHeaderInfo,
    frame: Bytes,
    ctx: &RequestContext,
) -> Reply {
    let peer = ctx.peer;
    let api_key = match &header.api {
        RequestApi::Supported { key, .. } | RequestApi::UnsupportedVersion { key, .. } => *key,
        RequestApi::UnknownKey => {
            warn!(%peer, api_key = header.api_key, correlation_id = ctx.correlation_id,
                "unknown API key; closing connection");
            return Reply::Close;
        }
    };
    let served = api_versions::supported_versions(api_key)
        .is_some_and(|range| (range.min..=range.max).contains(&header.api_version));
    if !served {
        if api_key == ApiKey::ApiVersions {
            // Kafka answers an ApiVersions of an unknown version in version 0 with
            // UNSUPPORTED_VERSION and the supported list, so newer clients can downgrade.
            debug!(%peer, version = header.api_version, "ApiVersions version not supported");
            return unsupported_api_versions(ctx.correlation_id);
        }
        warn!(%peer, ?api_key, version = header.api_version, correlation_id = ctx.correlation_id,
            client_id = ?ctx.client_id, "API or version not supported; closing connection");
        return Reply::Close;
    }

    // A Produce expands into per-partition state however small its partitions are: charge
    // that before decoding. Waiting while holding the frame's own charge could deadlock
    // requests against each other, so the wait is bounded; a request that cannot get its
    // memory in time closes its connection (the client reconnects and retries).
    let _partitions_charge = if api_key == ApiKey::Produce {
        let partitions =
            strata_wire::count::produce_partition_count(header.api_version, &frame).unwrap_or(0);
        let cost = partitions.saturating_mul(crate::limits::PRODUCE_PARTITION_COST);
        let memory = &broker.limits.memory;
        if !memory.fits(cost) {
            warn!(%peer, partitions, correlation_id = ctx.correlation_id,
                "produce names more partitions than the request memory can hold; closing connection");
            return Reply::Close;
        }
        let patience = broker.settings.request_read_timeout;
        match strata_core::timeout(broker.clock.as_ref(), patience, memory.charge(cost)).await {
            Ok(Some(charge)) => Some(charge),
            _ => {
                warn!(%peer, partitions, correlation_id = ctx.correlation_id,
                    "no request memory for the produce's partitions in time; closing connection");
                return Reply::Close;
            }
        }
    } else {
        None
    };
    let request = match strata_wire::decode_request(&header, &frame) {
        Ok(request) => request,
        Err(e) => {
            warn!(%peer, ?api_key, version = ctx.api_version, correlation_id = ctx.correlation_id,
                client_id = ?ctx.client_id, principal = %ctx.principal, error = %e,
                "undecodable request");
            return error_answer(api_key, ctx).unwrap_or(Reply::Close);
        }
    };
    let request_bytes = frame.len();
    match route(broker, request, ctx, request_bytes).await {
        Ok(reply) => reply,
        Err(e) => {
            error!(%peer, ?api_key, version = ctx.api_version, error = %e,
                "could not encode response (bug); closing connection");
            Reply::Close
        }
    }
}

/// Encodes a handler's response at the request's version, and tallies its error codes.
pub(crate) fn respond<R: Encodable + HeaderVersion + ErrorCodes>(
    ctx: &RequestContext,
    response: &R,
) -> Result<ResponseFrame, EncodeError> {
    ctx.errors.add_response(response);
    encode_response(
        ctx.correlation_id,
        R::header_version(ctx.api_version),
        response,
        ctx.api_version,
    )
}

/// Encodes a handler's response with the request quota's throttle in it, and mutes the
/// connection for that long (Kafka's request quota: the client is answered, then slowed).
fn reply<R: Encodable + HeaderVersion + ErrorCodes + ThrottleTime>(
    broker: &Broker,
    ctx: &RequestContext,
    mut response: R,
) -> Result<Reply, EncodeError> {
    let mute = request_throttle(broker, ctx);
    response.set_throttle_time_ms(throttle_ms(mute));
    Ok(throttled(Some(respond(ctx, &response)?), mute))
}

/// Charges the request's busy time so far to its connection's `request_percentage` quota and
/// returns the throttle that earns (zero without a quota or within it).
pub(crate) fn request_throttle(broker: &Broker, ctx: &RequestContext) -> Duration {
    let client_id = ctx.client_id.as_deref().unwrap_or("");
    broker
        .quotas
        .request_time(&ctx.principal.name, client_id, ctx.busy.take_uncharged())
}

/// The throttle a request of `bytes` costs its connection's `kind` quota (zero if none applies
/// or it is within it). Kafka records a Produce's request size and a Fetch's response size,
/// after the request is handled: the client is answered, then slowed.
fn throttle(broker: &Broker, ctx: &RequestContext, kind: QuotaKind, bytes: usize) -> Duration {
    let client_id = ctx.client_id.as_deref().unwrap_or("");
    broker
        .quotas
        .record(kind, &ctx.principal.name, client_id, bytes as f64)
}

fn throttle_ms(throttle: Duration) -> i32 {
    i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX)
}

fn throttled(frame: Option<ResponseFrame>, mute: Duration) -> Reply {
    match frame {
        _ if !mute.is_zero() => Reply::Throttled { frame, mute },
        Some(frame) => Reply::Frame(frame),
        None => Reply::Nothing,
    }
}

async fn route(
    broker: &Broker,
    request: RequestKind,
    ctx: &RequestContext,
    request_bytes: usize,
) -> Result<Reply, EncodeError> {
    use handlers::*;
    match request {
        RequestKind::ApiVersions(r) => reply(broker, ctx, crate::api_versions::handle(r, ctx)),
        RequestKind::Produce(r) => match produce::handle(broker, r, ctx).await {
            produce::Outcome::Respond(mut response) => {
                // Kafka: both quotas are charged, the longer throttle applies.
                let mute = throttle(broker, ctx, QuotaKind::Produce, request_bytes)
                    .max(request_throttle(broker, ctx));
                response.throttle_time_ms = throttle_ms(mute);
                Ok(throttled(Some(respond(ctx, &response)?), mute))
            }
            produce::Outcome::NoResponse => {
                // Kafka exempts acks=0 from the request quota (its time is charged unthrottled
                // once the request is done, like every request's remainder).
                let mute = throttle(broker, ctx, QuotaKind::Produce, request_bytes);
                Ok(throttled(None, mute))
            }
            produce::Outcome::CloseConnection => Ok(Reply::Close),
        },
        RequestKind::Fetch(r) => {
            let (frame, mute) = fetch::handle(broker, r, ctx).await?;
            Ok(throttled(Some(frame), mute))
        }
        RequestKind::ListOffsets(r) => {
            reply(broker, ctx, list_offsets::handle(broker, r, ctx).await)
        }
        RequestKind::Metadata(r) => reply(broker, ctx, metadata::handle(broker, r, ctx).await),
        RequestKind::CreateTopics(r) => {
            reply(broker, ctx, topics::create_topics(broker, r, ctx).await)
        }
        RequestKind::DeleteTopics(r) => {
            reply(broker, ctx, topics::delete_topics(broker, r, ctx).await)
        }
        RequestKind::CreatePartitions(r) => {
            reply(broker, ctx, topics::create_partitions(broker, r, ctx).await)
        }
        RequestKind::DeleteRecords(r) => {
            reply(broker, ctx, records::delete_records(broker, r, ctx).await)
        }
        RequestKind::DescribeConfigs(r) => {
            reply(broker, ctx, configs::describe_configs(broker, r, ctx).await)
        }
        RequestKind::AlterConfigs(r) => {
            reply(broker, ctx, configs::alter_configs(broker, r, ctx).await)
        }
        RequestKind::IncrementalAlterConfigs(r) => reply(
            broker,
            ctx,
            configs::incremental_alter_configs(broker, r, ctx).await,
        ),
        RequestKind::DescribeTopicPartitions(r) => reply(
            broker,
            ctx,
            admin::describe_topic_partitions(broker, r, ctx),
        ),
        RequestKind::DescribeLogDirs(r) => {
            reply(broker, ctx, admin::describe_log_dirs(broker, r, ctx))
        }
        RequestKind::ListConfigResources(r) => {
            reply(broker, ctx, admin::list_config_resources(broker, r, ctx))
        }
        RequestKind::DescribeProducers(r) => {
            reply(broker, ctx, admin::describe_producers(broker, r, ctx))
        }
        RequestKind::DescribeAcls(r) => reply(broker, ctx, security::describe_acls(broker, r, ctx)),
        RequestKind::CreateAcls(r) => {
            reply(broker, ctx, security::create_acls(broker, r, ctx).await)
        }
        RequestKind::DeleteAcls(r) => {
            reply(broker, ctx, security::delete_acls(broker, r, ctx).await)
        }
        RequestKind::DescribeUserScramCredentials(r) => reply(
            broker,
            ctx,
            security::describe_user_scram_credentials(broker, r, ctx).await,
        ),
        RequestKind::AlterUserScramCredentials(r) => reply(
            broker,
            ctx,
            security::alter_user_scram_credentials(broker, r, ctx).await,
        ),
        // The connection runs the SASL exchange itself, before anything reaches here, and
        // re-authentications (KIP-368) when `connections_max_reauth` is set; otherwise, once
        // authenticated (or on a listener without SASL), a new exchange is out of turn.
        RequestKind::SaslHandshake(_) => {
            let mut response = SaslHandshakeResponse::default();
            response.error_code = code::ILLEGAL_SASL_STATE;
            response.mechanisms = broker
                .settings
                .sasl_enabled_mechanisms
                .iter()
                .map(|m| kafka_protocol::protocol::StrBytes::from_string(m.clone()))
                .collect();
            Ok(Reply::Frame(respond(ctx, &response)?))
        }
        RequestKind::SaslAuthenticate(_) => {
            let mut response = SaslAuthenticateResponse::default();
            response.error_code = code::ILLEGAL_SASL_STATE;
            response.error_message =
                crate::errors::message("SaslAuthenticate outside a SASL exchange");
            Ok(Reply::Frame(respond(ctx, &response)?))
        }
        RequestKind::DescribeClientQuotas(r) => {
            reply(broker, ctx, quotas::describe_client_quotas(broker, r, ctx))
        }
        RequestKind::AlterClientQuotas(r) => reply(
            broker,
            ctx,
            quotas::alter_client_quotas(broker, r, ctx).await,
        ),
        RequestKind::WriteTxnMarkers(r) => {
            reply(broker, ctx, txn_markers::handle(broker, r, ctx).await)
        }
        RequestKind::ListTransactions(r) => {
            reply(broker, ctx, txn::list_transactions(broker, r, ctx).await)
        }
        RequestKind::DescribeTransactions(r) => reply(
            broker,
            ctx,
            txn::describe_transactions(broker, r, ctx).await,
        ),
        RequestKind::AddPartitionsToTxn(r) => reply(
            broker,
            ctx,
            txn::add_partitions_to_txn(broker, r, ctx).await,
        ),
        RequestKind::EndTxn(r) => reply(broker, ctx, txn::end_txn(broker, r, ctx).await),
        RequestKind::AddOffsetsToTxn(r) => {
            reply(broker, ctx, txn::add_offsets_to_txn(broker, r, ctx).await)
        }
        RequestKind::TxnOffsetCommit(r) => {
            reply(broker, ctx, txn::txn_offset_commit(broker, r, ctx).await)
        }
        RequestKind::DescribeCluster(r) => {
            reply(broker, ctx, cluster::describe_cluster(broker, r, ctx))
        }
        RequestKind::AlterPartitionReassignments(r) => reply(
            broker,
            ctx,
            cluster::alter_partition_reassignments(broker, r, ctx).await,
        ),
        RequestKind::ElectLeaders(r) => {
            reply(broker, ctx, cluster::elect_leaders(broker, r, ctx).await)
        }
        RequestKind::ListPartitionReassignments(r) => reply(
            broker,
            ctx,
            cluster::list_partition_reassignments(broker, r, ctx).await,
        ),
        RequestKind::InitProducerId(r) => reply(
            broker,
            ctx,
            producer::init_producer_id(broker, r, ctx).await,
        ),
        RequestKind::OffsetForLeaderEpoch(r) => reply(
            broker,
            ctx,
            leader_epoch::offset_for_leader_epoch(broker, r, ctx),
        ),
        RequestKind::FindCoordinator(r) => {
            reply(broker, ctx, groups::find_coordinator(broker, r, ctx).await)
        }
        RequestKind::JoinGroup(r) => reply(broker, ctx, groups::join_group(broker, r, ctx).await),
        RequestKind::SyncGroup(r) => reply(broker, ctx, groups::sync_group(broker, r, ctx).await),
        RequestKind::Heartbeat(r) => reply(broker, ctx, groups::heartbeat(broker, r, ctx).await),
        RequestKind::LeaveGroup(r) => reply(broker, ctx, groups::leave_group(broker, r, ctx).await),
        RequestKind::OffsetCommit(r) => {
            reply(broker, ctx, groups::offset_commit(broker, r, ctx).await)
        }
        RequestKind::OffsetFetch(r) => {
            reply(broker, ctx, groups::offset_fetch(broker, r, ctx).await)
        }
        RequestKind::OffsetDelete(r) => {
            reply(broker, ctx, groups::offset_delete(broker, r, ctx).await)
        }
        RequestKind::DescribeGroups(r) => {
            reply(broker, ctx, groups::describe_groups(broker, r, ctx).await)
        }
        RequestKind::ListGroups(r) => reply(broker, ctx, groups::list_groups(broker, r, ctx).await),
        RequestKind::DeleteGroups(r) => {
            reply(broker, ctx, groups::delete_groups(broker, r, ctx).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => reply(
            broker,
            ctx,
            consumer_groups::consumer_group_heartbeat(broker, r, ctx).await,
        ),
        RequestKind::ConsumerGroupDescribe(r) => reply(
            broker,
            ctx,
            consumer_groups::consumer_group_describe(broker, r, ctx).await,
        ),
        RequestKind::ShareGroupHeartbeat(r) => reply(
            broker,
            ctx,
            share_groups::share_group_heartbeat(broker, r, ctx).await,
        ),
        RequestKind::ShareGroupDescribe(r) => reply(
            broker,
            ctx,
            share_groups::share_group_describe(broker, r, ctx).await,
        ),
        RequestKind::ShareFetch(r) => {
            reply(broker, ctx, share_groups::share_fetch(broker, r, ctx).await)
        }
        RequestKind::ShareAcknowledge(r) => reply(
            broker,
            ctx,
            share_groups::share_acknowledge(broker, r, ctx).await,
        ),
        RequestKind::DescribeShareGroupOffsets(r) => reply(
            broker,
            ctx,
            share_offsets::describe_share_group_offsets(broker, r, ctx).await,
        ),
        RequestKind::AlterShareGroupOffsets(r) => reply(
            broker,
            ctx,
            share_offsets::alter_share_group_offsets(broker, r, ctx).await,
        ),
        RequestKind::DeleteShareGroupOffsets(r) => reply(
            broker,
            ctx,
            share_offsets::delete_share_group_offsets(broker, r, ctx).await,
        ),
        // The version check above only lets through keys of api_versions::IMPLEMENTED, so a
        // key advertised without a route is refused, not answered wrongly.
        _ => {
            error!(peer = %ctx.peer, "API advertised but not routed (bug); closing connection");
            Ok(Reply::Close)
        }
    }
}

/// The ApiVersions v0 answer to an ApiVersions request of a version we do not serve.
fn unsupported_api_versions(correlation_id: i32) -> Reply {
    let response = api_versions::error_response(code::UNSUPPORTED_VERSION);
    match encode_response(correlation_id, 0, &response, 0) {
        Ok(frame) => Reply::Frame(frame),
        Err(e) => {
            error!(error = %e, "could not encode ApiVersions v0 (bug)");
            Reply::Close
        }
    }
}

/// An answer to an undecodable request, for the APIs whose response carries a top-level error
/// code (so the error says something without echoing the request's items). For the others
/// there is no honest answer and the connection is closed, as Kafka does.
fn error_answer(api_key: ApiKey, ctx: &RequestContext) -> Option<Reply> {
    let frame = match api_key {
        ApiKey::ApiVersions => respond(ctx, &api_versions::error_response(code::INVALID_REQUEST)),
        ApiKey::Fetch if ctx.api_version >= 7 => {
            let mut response = FetchResponse::default();
            response.error_code = code::INVALID_REQUEST;
            respond(ctx, &response)
        }
        ApiKey::InitProducerId => {
            let mut response = InitProducerIdResponse::default();
            response.error_code = code::INVALID_REQUEST;
            response.producer_epoch = -1;
            respond(ctx, &response)
        }
        ApiKey::DescribeCluster => {
            let mut response = DescribeClusterResponse::default();
            response.error_code = code::INVALID_REQUEST;
            response.error_message = crate::errors::message("undecodable request");
            respond(ctx, &response)
        }
        _ => return None,
    };
    frame.ok().map(Reply::Frame)
}
