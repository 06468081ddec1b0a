//! APIs of features Strata does not have, answered at once and precisely the way a Kafka
//! broker without them answers, so tools fail (or show nothing) immediately instead of
//! waiting for a timeout:
//!
//! - DescribeAcls, CreateAcls, DeleteAcls (v1–v3): SECURITY_DISABLED, as a Kafka broker with
//!   no authorizer configured (every client may do everything; `*_authorized_operations` say so).
//! - DescribeUserScramCredentials (v0): there are no SCRAM users: all of them is an empty list,
//!   a named one RESOURCE_NOT_FOUND, as Kafka answers for a user without credentials.
//! - DescribeClientQuotas (v0–v1): there are no quotas: no entries.
//! - ListTransactions (v0–v2), DescribeTransactions (v0): transactions are not implemented, so
//!   there are none to list, and a named one is TRANSACTIONAL_ID_NOT_FOUND.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResult;
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    ListTransactionsRequest, ListTransactionsResponse, ProducerId,
};

use crate::errors::{code, message};
use crate::RequestContext;

/// Kafka's words for the same condition, so tools print what they print against Kafka.
const NO_AUTHORIZER: &str = "No Authorizer is configured.";

pub(crate) fn describe_acls(
    _request: DescribeAclsRequest,
    _ctx: &RequestContext,
) -> DescribeAclsResponse {
    let mut response = DescribeAclsResponse::default();
    response.error_code = code::SECURITY_DISABLED;
    response.error_message = message(NO_AUTHORIZER);
    response
}

pub(crate) fn create_acls(request: CreateAclsRequest, _ctx: &RequestContext) -> CreateAclsResponse {
    let mut response = CreateAclsResponse::default();
    response.results = request
        .creations
        .iter()
        .map(|_| {
            let mut r = AclCreationResult::default();
            r.error_code = code::SECURITY_DISABLED;
            r.error_message = message(NO_AUTHORIZER);
            r
        })
        .collect();
    response
}

pub(crate) fn delete_acls(request: DeleteAclsRequest, _ctx: &RequestContext) -> DeleteAclsResponse {
    let mut response = DeleteAclsResponse::default();
    response.filter_results = request
        .filters
        .iter()
        .map(|_| {
            let mut r = DeleteAclsFilterResult::default();
            r.error_code = code::SECURITY_DISABLED;
            r.error_message = message(NO_AUTHORIZER);
            r
        })
        .collect();
    response
}

pub(crate) fn describe_user_scram_credentials(
    request: DescribeUserScramCredentialsRequest,
    _ctx: &RequestContext,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default();
    response.error_code = code::NONE;
    response.results = request
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|user| {
            let mut r = DescribeUserScramCredentialsResult::default();
            r.error_code = code::RESOURCE_NOT_FOUND;
            r.error_message = message(format!(
                "Attempt to describe a user credential that does not exist: {}",
                user.name.as_str()
            ));
            r.user = user.name;
            r
        })
        .collect();
    response
}

pub(crate) fn describe_client_quotas(
    _request: DescribeClientQuotasRequest,
    _ctx: &RequestContext,
) -> DescribeClientQuotasResponse {
    let mut response = DescribeClientQuotasResponse::default();
    response.error_code = code::NONE;
    response.entries = Some(Vec::new());
    response
}

/// Kafka's transaction states, for ListTransactions' `unknown_state_filters`.
const TRANSACTION_STATES: &[&str] = &[
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
];

pub(crate) fn list_transactions(
    request: ListTransactionsRequest,
    _ctx: &RequestContext,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    response.error_code = code::NONE;
    response.unknown_state_filters = request
        .state_filters
        .into_iter()
        .filter(|s| !TRANSACTION_STATES.contains(&s.as_str()))
        .collect();
    response
}

pub(crate) fn describe_transactions(
    request: DescribeTransactionsRequest,
    _ctx: &RequestContext,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    response.transaction_states = request
        .transactional_ids
        .into_iter()
        .map(|id| {
            let mut s = TransactionState::default();
            s.error_code = code::TRANSACTIONAL_ID_NOT_FOUND;
            s.transactional_id = id;
            s.transaction_state = kafka_protocol::protocol::StrBytes::from_static_str("");
            s.producer_id = ProducerId(-1);
            s.producer_epoch = -1;
            s
        })
        .collect();
    response
}
