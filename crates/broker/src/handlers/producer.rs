//! InitProducerId (v0–v4). A transactional id goes to the transaction coordinator
//! (`txn.rs`). A non-transactional producer that re-initialises (v3+, after an epoch bump or an unknown
//! producer id) gets a fresh producer id, as Kafka gives idempotent producers.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use tracing::info;

use crate::authorize::{Op, Res};
use crate::errors::{code, error_code};
use crate::server::Broker;
use crate::RequestContext;

pub(crate) async fn init_producer_id(
    broker: &Broker,
    request: InitProducerIdRequest,
    ctx: &RequestContext,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    // Kafka treats an empty transactional id as none.
    if let Some(id) = request
        .transactional_id
        .as_ref()
        .filter(|id| !id.is_empty())
    {
        let id = id.to_string();
        return super::txn::init_producer_id(broker, request, id, ctx).await;
    }
    // Kafka: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic.
    let authz = broker.authz(ctx);
    if !authz.allows_cluster(Op::IdempotentWrite) && !authz.allows_any(Op::Write, Res::Topic) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        return response;
    }
    match broker.log.init_producer_id().await {
        Ok((producer_id, epoch)) => {
            info!(peer = %ctx.peer, client_id = ?ctx.client_id, producer_id, "new idempotent producer");
            response.error_code = code::NONE;
            response.producer_id = ProducerId(producer_id);
            response.producer_epoch = epoch;
        }
        Err(e) => response.error_code = error_code(&e),
    }
    response
}
