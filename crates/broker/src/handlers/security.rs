//! The SCRAM user APIs (DescribeUserScramCredentials, AlterUserScramCredentials) over the
//! user store in shared storage; and the APIs of features Strata does not have, answered at once and precisely the way a Kafka
//! broker without them answers, so tools fail (or show nothing) immediately instead of
//! waiting for a timeout:
//!
//! - DescribeAcls, CreateAcls, DeleteAcls (v1–v3): SECURITY_DISABLED, as a Kafka broker with
//!   no authorizer configured (every client may do everything; `*_authorized_operations` say so).
//! - ListTransactions (v0–v2), DescribeTransactions (v0): transactions are not implemented, so
//!   there are none to list, and a named one is TRANSACTIONAL_ID_NOT_FOUND.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use std::collections::HashSet;

use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, CreateAclsRequest,
    CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    ListTransactionsRequest, ListTransactionsResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use strata_layout::users::StoredUser;

use crate::errors::{code, message, security_error_code};
use crate::security::scram::{Credential, Mechanism};
use crate::security::users::{check_credential, Change};
use crate::security::SecurityError;
use crate::server::Broker;
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

/// Kafka's answer for a user without credentials.
fn no_such_user(user: &str) -> String {
    format!("Attempt to describe a user credential that does not exist: {user}")
}

fn describe_result(
    name: StrBytes,
    user: Option<&StoredUser>,
) -> DescribeUserScramCredentialsResult {
    let mut r = DescribeUserScramCredentialsResult::default();
    match user {
        Some(user) => {
            r.error_code = code::NONE;
            r.credential_infos = user
                .credentials
                .iter()
                .filter_map(|c| {
                    let mechanism = Mechanism::from_name(&c.mechanism)?;
                    let mut info = CredentialInfo::default();
                    info.mechanism = mechanism.kafka_type();
                    info.iterations = i32::try_from(c.iterations).unwrap_or(i32::MAX);
                    Some(info)
                })
                .collect();
        }
        None => {
            r.error_code = code::RESOURCE_NOT_FOUND;
            r.error_message = message(no_such_user(name.as_str()));
        }
    }
    r.user = name;
    r
}

/// DescribeUserScramCredentials v0: every user (`users` null or empty), or the named ones,
/// each with its mechanisms and iterations (never salts or keys).
pub(crate) async fn describe_user_scram_credentials(
    broker: &Broker,
    request: DescribeUserScramCredentialsRequest,
    _ctx: &RequestContext,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default();
    let store = match broker.users() {
        Ok(store) => store,
        Err(e) => {
            response.error_code = security_error_code(&e);
            response.error_message = message(e.to_string());
            return response;
        }
    };
    let names = request.users.unwrap_or_default();
    if names.is_empty() {
        match store.list().await {
            Ok(users) => {
                response.results = users
                    .iter()
                    .map(|(name, user)| {
                        describe_result(StrBytes::from_string(name.clone()), Some(user))
                    })
                    .collect();
            }
            Err(e) => {
                response.error_code = security_error_code(&e);
                response.error_message = message(e.to_string());
            }
        }
        return response;
    }
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = names
        .iter()
        .filter(|n| !seen.insert(n.name.to_string()))
        .map(|n| n.name.to_string())
        .collect();
    let mut reported = HashSet::new();
    for name in names {
        let user = name.name.to_string();
        if duplicates.contains(&user) {
            if reported.insert(user.clone()) {
                let mut r = DescribeUserScramCredentialsResult::default();
                r.error_code = code::DUPLICATE_RESOURCE;
                r.error_message = message(format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}"));
                r.user = name.name;
                response.results.push(r);
            }
            continue;
        }
        match store.describe(&user).await {
            Ok(found) => response
                .results
                .push(describe_result(name.name, found.as_ref())),
            Err(e) => {
                let mut r = DescribeUserScramCredentialsResult::default();
                r.error_code = security_error_code(&e);
                r.error_message = message(e.to_string());
                r.user = name.name;
                response.results.push(r);
            }
        }
    }
    response
}

/// What one user's part of an AlterUserScramCredentials request asks, or why it is refused.
fn user_changes(
    deletions: &[&ScramCredentialDeletion],
    upsertions: &[&ScramCredentialUpsertion],
) -> Result<Vec<Change>, SecurityError> {
    let mut changes = Vec::new();
    let mut mechanisms = HashSet::new();
    for deletion in deletions {
        let mechanism = Mechanism::from_kafka_type(deletion.mechanism).ok_or_else(|| {
            SecurityError::UnsupportedMechanism(format!("type {}", deletion.mechanism))
        })?;
        if !mechanisms.insert(mechanism) {
            return Err(SecurityError::Duplicate(format!(
                "{} changed twice for one user",
                mechanism.name()
            )));
        }
        changes.push(Change::Delete(mechanism));
    }
    for upsertion in upsertions {
        let mechanism = Mechanism::from_kafka_type(upsertion.mechanism).ok_or_else(|| {
            SecurityError::UnsupportedMechanism(format!("type {}", upsertion.mechanism))
        })?;
        if !mechanisms.insert(mechanism) {
            return Err(SecurityError::Duplicate(format!(
                "{} changed twice for one user",
                mechanism.name()
            )));
        }
        let iterations = u32::try_from(upsertion.iterations).map_err(|_| {
            SecurityError::Unacceptable(format!("Iterations {} out of range", upsertion.iterations))
        })?;
        if upsertion.salted_password.len() != mechanism.output_len() {
            return Err(SecurityError::Unacceptable(
                "salted password has the wrong length for its mechanism".into(),
            ));
        }
        let credential = Credential::from_salted_password(
            mechanism,
            &upsertion.salted_password,
            upsertion.salt.to_vec(),
            iterations,
        );
        check_credential(upsertion.name.as_str(), &credential)?;
        changes.push(Change::Upsert(credential));
    }
    Ok(changes)
}

/// AlterUserScramCredentials v0: each user's deletions and upsertions, as one
/// compare-and-swap of its object, so they apply together or not at all.
pub(crate) async fn alter_user_scram_credentials(
    broker: &Broker,
    request: AlterUserScramCredentialsRequest,
    _ctx: &RequestContext,
) -> AlterUserScramCredentialsResponse {
    let mut response = AlterUserScramCredentialsResponse::default();
    let mut users: Vec<StrBytes> = Vec::new();
    for name in request
        .deletions
        .iter()
        .map(|d| &d.name)
        .chain(request.upsertions.iter().map(|u| &u.name))
    {
        if !users.contains(name) {
            users.push(name.clone());
        }
    }
    for user in users {
        let deletions: Vec<_> = request
            .deletions
            .iter()
            .filter(|d| d.name == user)
            .collect();
        let upsertions: Vec<_> = request
            .upsertions
            .iter()
            .filter(|u| u.name == user)
            .collect();
        let outcome = match user_changes(&deletions, &upsertions) {
            Ok(changes) => match broker.users() {
                Ok(store) => store.alter(user.as_str(), &changes).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let mut r = AlterUserScramCredentialsResult::default();
        match outcome {
            Ok(()) => r.error_code = code::NONE,
            Err(e) => {
                r.error_code = security_error_code(&e);
                r.error_message = message(e.to_string());
            }
        }
        r.user = user;
        response.results.push(r);
    }
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
