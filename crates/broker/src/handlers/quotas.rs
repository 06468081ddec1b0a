//! DescribeClientQuotas and AlterClientQuotas (v0–v1) over the quota objects in shared
//! storage, with Kafka's entity model and filter semantics (`crate::quotas::model`).

use kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlterEntity, EntryData as AlterEntry,
};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{info, warn};

use crate::authorize::Op as AclOp;
use crate::errors::{code, message, quota_error_code};
use crate::quotas::store::{parse_op, Op, QuotaError};
use crate::quotas::{Entity, Filter};
use crate::server::Broker;
use crate::RequestContext;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The entities the filter matches, as this broker last read them from storage (a change
/// made through another broker shows here within `quota_refresh_interval`).
pub(crate) fn describe_client_quotas(
    broker: &Broker,
    request: DescribeClientQuotasRequest,
    ctx: &RequestContext,
) -> DescribeClientQuotasResponse {
    let mut response = DescribeClientQuotasResponse::default();
    // Kafka's rule: DESCRIBE_CONFIGS on the cluster.
    if !broker.authz(ctx).allows_cluster(AclOp::DescribeConfigs) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        response.error_message =
            message("DescribeClientQuotas needs DESCRIBE_CONFIGS on the cluster".to_string());
        return response;
    }
    let components = request.components.into_iter().map(|c| {
        (
            c.entity_type.to_string(),
            c.match_type,
            c._match.map(|m| m.to_string()),
        )
    });
    let filter = match Filter::new(components, request.strict) {
        Ok(filter) => filter,
        Err((unknown_type, why)) => {
            response.error_code = if unknown_type {
                code::UNSUPPORTED_VERSION
            } else {
                code::INVALID_REQUEST
            };
            response.error_message = message(why);
            return response;
        }
    };
    let entries = broker
        .quotas
        .table()
        .describe(&filter)
        .into_iter()
        .map(|(entity, values)| {
            let mut entry = EntryData::default();
            entry.entity = entity
                .parts()
                .into_iter()
                .map(|(entity_type, name)| {
                    let mut part = EntityData::default();
                    part.entity_type = text(entity_type);
                    part.entity_name = name.map(text);
                    part
                })
                .collect();
            entry.values = values
                .into_iter()
                .map(|(kind, value)| {
                    let mut v = ValueData::default();
                    v.key = text(kind.key());
                    v.value = value;
                    v
                })
                .collect();
            entry
        })
        .collect();
    response.error_code = code::NONE;
    response.entries = Some(entries);
    response
}

/// Each entry is validated, then (unless `validate_only`) written on its own: one entity's
/// failure does not undo another's change, as in Kafka.
pub(crate) async fn alter_client_quotas(
    broker: &Broker,
    request: AlterClientQuotasRequest,
    ctx: &RequestContext,
) -> AlterClientQuotasResponse {
    let mut response = AlterClientQuotasResponse::default();
    let mut changed = false;
    // Kafka's rule: ALTER_CONFIGS on the cluster, else every entry is refused.
    let allowed = broker.authz(ctx).allows_cluster(AclOp::AlterConfigs);
    for entry in request.entries {
        let mut result = AlterEntry::default();
        result.entity = entry
            .entity
            .iter()
            .map(|e| {
                let mut part = AlterEntity::default();
                part.entity_type = e.entity_type.clone();
                part.entity_name = e.entity_name.clone();
                part
            })
            .collect();
        let parts = entry.entity.iter().map(|e| {
            (
                e.entity_type.to_string(),
                e.entity_name.as_ref().map(|n| n.to_string()),
            )
        });
        let parsed = Entity::from_parts(parts)
            .map_err(QuotaError::Invalid)
            .and_then(|entity| {
                let ops = entry
                    .ops
                    .iter()
                    .map(|op| parse_op(op.key.as_str(), op.value, op.remove))
                    .collect::<Result<Vec<Op>, _>>()?;
                let mut keys: Vec<_> = ops.iter().map(|op| op.kind).collect();
                keys.sort();
                keys.dedup();
                if keys.len() != ops.len() {
                    return Err(QuotaError::Invalid(
                        "A quota key was named more than once for one entity".into(),
                    ));
                }
                Ok((entity, ops))
            });
        let outcome = match parsed {
            _ if !allowed => Err(QuotaError::NotAuthorized),
            Ok((entity, ops)) if request.validate_only => Ok((entity, ops)),
            Ok((entity, ops)) => match broker.quota_store.as_deref() {
                None => Err(QuotaError::Invalid(
                    "this broker keeps no client quotas".into(),
                )),
                Some(store) => store.alter(&entity, &ops).await.map(|()| {
                    changed = true;
                    (entity, ops)
                }),
            },
            Err(e) => Err(e),
        };
        match outcome {
            Ok((entity, ops)) => {
                if !request.validate_only {
                    info!(principal = %ctx.principal, ?entity, ?ops, "client quotas altered");
                }
                result.error_code = code::NONE;
            }
            Err(e) => {
                if matches!(e, QuotaError::Storage(_) | QuotaError::Contended) {
                    warn!(principal = %ctx.principal, error = %e, "could not alter client quotas");
                }
                result.error_code = quota_error_code(&e);
                result.error_message = message(e.to_string());
            }
        }
        response.entries.push(result);
    }
    // This broker applies its own change at once rather than at its next poll, so a
    // DescribeClientQuotas right after sees it.
    if changed {
        if let Some(store) = broker.quota_store.as_deref() {
            if let Err(e) = store.reload_into(&broker.quotas).await {
                warn!(error = %e, "could not reload client quotas after a change");
            }
        }
    }
    response
}
