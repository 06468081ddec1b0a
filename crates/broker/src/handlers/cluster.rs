//! DescribeCluster (v0–v1): this broker is the cluster and its controller.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    BrokerId as WireBrokerId, DescribeClusterRequest, DescribeClusterResponse,
};

use super::{acl_op, str_bytes};
use crate::errors::{code, message};
use crate::server::Broker;
use crate::RequestContext;

/// DescribeCluster endpoint types (v1+).
const ENDPOINT_BROKERS: i8 = 1;
const ENDPOINT_CONTROLLERS: i8 = 2;

pub(crate) fn describe_cluster(
    broker: &Broker,
    request: DescribeClusterRequest,
    ctx: &RequestContext,
) -> DescribeClusterResponse {
    let v = ctx.api_version;
    let node_id = broker.settings.node_id.0;
    let mut response = DescribeClusterResponse::default();
    if v >= 1 {
        response.endpoint_type = request.endpoint_type;
        match request.endpoint_type {
            ENDPOINT_BROKERS => {}
            ENDPOINT_CONTROLLERS => {
                // Kafka brokers answer this way too: controllers are asked directly.
                response.error_code = code::MISMATCHED_ENDPOINT_TYPE;
                response.error_message = message("this endpoint serves brokers, not controllers");
                return response;
            }
            other => {
                response.error_code = code::UNSUPPORTED_ENDPOINT_TYPE;
                response.error_message = message(format!("unknown endpoint type {other}"));
                return response;
            }
        }
    }
    response.error_code = code::NONE;
    response.cluster_id = str_bytes(&broker.settings.cluster_id);
    response.controller_id = WireBrokerId(node_id);
    let mut me = DescribeClusterBroker::default();
    me.broker_id = WireBrokerId(node_id);
    me.host = str_bytes(&broker.settings.advertised_host);
    me.port = i32::from(broker.settings.advertised_port);
    response.brokers = vec![me];
    if request.include_cluster_authorized_operations {
        response.cluster_authorized_operations = acl_op::cluster_all();
    }
    response
}
