//! The ACL APIs (CreateAcls, DescribeAcls, DeleteAcls, v1–v3: SECURITY_DISABLED with
//! `authorizer = none`, as a Kafka broker without an authorizer) over the ACLs in shared
//! storage; the SCRAM user APIs (DescribeUserScramCredentials, AlterUserScramCredentials) over
//! the user store.

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
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
    DescribeAclsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strata_layout::users::StoredUser;

use crate::authorize::Op;
use crate::errors::{code, message, security_error_code};
use crate::security::acl::{
    self, AccessEntry, AclBinding, AclFilter, Operation, PatternFilter, PatternType, Permission,
    ResourcePattern, ResourceType,
};
use crate::security::scram::{Credential, Mechanism};
use crate::security::users::{check_credential, Change};
use crate::security::SecurityError;
use crate::server::Broker;
use crate::RequestContext;

/// A binding from a CreateAcls creation, or why it is refused.
fn creation_binding(c: &AclCreation) -> Result<AclBinding, SecurityError> {
    let invalid =
        |what: &str, code: i8| SecurityError::InvalidAcl(format!("Invalid {what} {code}"));
    let binding = AclBinding {
        pattern: ResourcePattern {
            resource_type: ResourceType::from_code(c.resource_type)
                .ok_or_else(|| invalid("resource type", c.resource_type))?,
            pattern_type: PatternType::from_code(c.resource_pattern_type)
                .ok_or_else(|| invalid("pattern type", c.resource_pattern_type))?,
            name: c.resource_name.to_string(),
        },
        entry: AccessEntry {
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: Operation::from_code(c.operation)
                .ok_or_else(|| invalid("operation", c.operation))?,
            permission: Permission::from_code(c.permission_type)
                .ok_or_else(|| invalid("permission type", c.permission_type))?,
        },
    };
    acl::validate(&binding).map_err(SecurityError::InvalidAcl)?;
    Ok(binding)
}

/// Kafka's codes for "any" in filters.
const ANY: i8 = 1;
const MATCH: i8 = 2;

/// A Describe/Delete filter from its wire fields, or why it is refused.
#[allow(clippy::too_many_arguments)]
fn filter(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern_type: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, SecurityError> {
    let invalid =
        |what: &str, code: i8| SecurityError::InvalidAcl(format!("Invalid {what} filter {code}"));
    Ok(AclFilter {
        resource_type: match resource_type {
            ANY => None,
            t => Some(ResourceType::from_code(t).ok_or_else(|| invalid("resource type", t))?),
        },
        name: name.map(|n| n.to_string()),
        pattern: match pattern_type {
            ANY => PatternFilter::Any,
            MATCH => PatternFilter::Match,
            t => PatternFilter::Exactly(
                PatternType::from_code(t).ok_or_else(|| invalid("pattern type", t))?,
            ),
        },
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation: match operation {
            ANY => None,
            o => Some(Operation::from_code(o).ok_or_else(|| invalid("operation", o))?),
        },
        permission: match permission {
            ANY => None,
            p => Some(Permission::from_code(p).ok_or_else(|| invalid("permission type", p))?),
        },
    })
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// DescribeAcls: the bindings the filter matches, grouped by resource pattern, from this
/// broker's snapshot. Needs DESCRIBE on the cluster.
pub(crate) fn describe_acls(
    broker: &Broker,
    request: DescribeAclsRequest,
    ctx: &RequestContext,
) -> DescribeAclsResponse {
    let mut response = DescribeAclsResponse::default();
    let outcome = broker.acls().and_then(|store| {
        if !broker.authz(ctx).allows_cluster(Op::Describe) {
            return Ok(None);
        }
        let filter = filter(
            request.resource_type_filter,
            request.resource_name_filter.as_ref(),
            request.pattern_type_filter,
            request.principal_filter.as_ref(),
            request.host_filter.as_ref(),
            request.operation,
            request.permission_type,
        )?;
        Ok(Some(
            store
                .snapshot()
                .bindings()
                .into_iter()
                .filter(|b| filter.matches(b))
                .collect::<Vec<_>>(),
        ))
    });
    match outcome {
        Ok(Some(bindings)) => {
            let mut resources: Vec<DescribeAclsResource> = Vec::new();
            for b in bindings {
                let mut description = AclDescription::default();
                description.principal = str_bytes(&b.entry.principal);
                description.host = str_bytes(&b.entry.host);
                description.operation = b.entry.operation.code();
                description.permission_type = b.entry.permission.code();
                let same = resources.last().is_some_and(|r| {
                    r.resource_type == b.pattern.resource_type.code()
                        && r.pattern_type == b.pattern.pattern_type.code()
                        && r.resource_name.as_str() == b.pattern.name
                });
                if !same {
                    let mut resource = DescribeAclsResource::default();
                    resource.resource_type = b.pattern.resource_type.code();
                    resource.resource_name = str_bytes(&b.pattern.name);
                    resource.pattern_type = b.pattern.pattern_type.code();
                    resources.push(resource);
                }
                if let Some(resource) = resources.last_mut() {
                    resource.acls.push(description);
                }
            }
            response.resources = resources;
        }
        Ok(None) => {
            response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
            response.error_message = message("Cluster authorization failed.");
        }
        Err(e) => {
            response.error_code = security_error_code(&e);
            response.error_message = message(e.to_string());
        }
    }
    response
}

/// CreateAcls: each binding validated and stored (one compare-and-swap per resource); one
/// result per binding. Needs ALTER on the cluster.
pub(crate) async fn create_acls(
    broker: &Broker,
    request: CreateAclsRequest,
    ctx: &RequestContext,
) -> CreateAclsResponse {
    let mut response = CreateAclsResponse::default();
    let refused = |code: i16, text: String| {
        let mut r = AclCreationResult::default();
        r.error_code = code;
        r.error_message = message(text);
        r
    };
    let store = match broker.acls() {
        Ok(store) => store,
        Err(e) => {
            response.results = request
                .creations
                .iter()
                .map(|_| refused(security_error_code(&e), e.to_string()))
                .collect();
            return response;
        }
    };
    if !broker.authz(ctx).allows_cluster(Op::Alter) {
        response.results = request
            .creations
            .iter()
            .map(|_| {
                refused(
                    code::CLUSTER_AUTHORIZATION_FAILED,
                    "Cluster authorization failed.".into(),
                )
            })
            .collect();
        return response;
    }
    let parsed: Vec<Result<AclBinding, SecurityError>> =
        request.creations.iter().map(creation_binding).collect();
    let valid: Vec<AclBinding> = parsed
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    let mut stored = store.create(&valid).await.into_iter();
    response.results = parsed
        .iter()
        .map(|p| {
            let outcome = match p {
                Err(e) => Err(security_error_code(e)).map_err(|c| (c, e.to_string())),
                Ok(_) => match stored.next() {
                    Some(Ok(())) => Ok(()),
                    Some(Err(e)) => Err((security_error_code(&e), e.to_string())),
                    None => Err((code::UNKNOWN_SERVER_ERROR, "no result (bug)".to_string())),
                },
            };
            match outcome {
                Ok(()) => AclCreationResult::default(),
                Err((code, text)) => refused(code, text),
            }
        })
        .collect();
    response
}

/// DeleteAcls: the bindings each filter matches, deleted from storage; one result per
/// filter listing what it deleted. Needs ALTER on the cluster.
pub(crate) async fn delete_acls(
    broker: &Broker,
    request: DeleteAclsRequest,
    ctx: &RequestContext,
) -> DeleteAclsResponse {
    let mut response = DeleteAclsResponse::default();
    let refused = |code: i16, text: String| {
        let mut r = DeleteAclsFilterResult::default();
        r.error_code = code;
        r.error_message = message(text);
        r
    };
    let everyone = |code: i16, text: String| -> Vec<DeleteAclsFilterResult> {
        request
            .filters
            .iter()
            .map(|_| refused(code, text.clone()))
            .collect()
    };
    let store = match broker.acls() {
        Ok(store) => store,
        Err(e) => {
            response.filter_results = everyone(security_error_code(&e), e.to_string());
            return response;
        }
    };
    if !broker.authz(ctx).allows_cluster(Op::Alter) {
        response.filter_results = everyone(
            code::CLUSTER_AUTHORIZATION_FAILED,
            "Cluster authorization failed.".into(),
        );
        return response;
    }
    let parsed: Vec<Result<AclFilter, SecurityError>> = request
        .filters
        .iter()
        .map(|f| {
            filter(
                f.resource_type_filter,
                f.resource_name_filter.as_ref(),
                f.pattern_type_filter,
                f.principal_filter.as_ref(),
                f.host_filter.as_ref(),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = parsed
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    let deleted = match store.delete(&valid).await {
        Ok(deleted) => deleted,
        Err(e) => {
            response.filter_results = everyone(security_error_code(&e), e.to_string());
            return response;
        }
    };
    let mut deleted = deleted.into_iter();
    response.filter_results = parsed
        .iter()
        .map(|p| match p {
            Err(e) => refused(security_error_code(e), e.to_string()),
            Ok(_) => match deleted.next() {
                Some(Ok(bindings)) => {
                    let mut r = DeleteAclsFilterResult::default();
                    r.matching_acls = bindings
                        .iter()
                        .map(|b| {
                            let mut m = DeleteAclsMatchingAcl::default();
                            m.resource_type = b.pattern.resource_type.code();
                            m.resource_name = str_bytes(&b.pattern.name);
                            m.pattern_type = b.pattern.pattern_type.code();
                            m.principal = str_bytes(&b.entry.principal);
                            m.host = str_bytes(&b.entry.host);
                            m.operation = b.entry.operation.code();
                            m.permission_type = b.entry.permission.code();
                            m
                        })
                        .collect();
                    r
                }
                Some(Err(e)) => refused(security_error_code(&e), e.to_string()),
                None => refused(code::UNKNOWN_SERVER_ERROR, "no result (bug)".into()),
            },
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
    ctx: &RequestContext,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default();
    if !broker.authz(ctx).allows_cluster(Op::Describe) {
        response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
        response.error_message = message("Cluster authorization failed.");
        return response;
    }
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
    ctx: &RequestContext,
) -> AlterUserScramCredentialsResponse {
    let mut response = AlterUserScramCredentialsResponse::default();
    let may_alter = broker.authz(ctx).allows_cluster(Op::Alter);
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
        if !may_alter {
            let mut r = AlterUserScramCredentialsResult::default();
            r.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
            r.error_message = message("Cluster authorization failed.");
            r.user = user;
            response.results.push(r);
            continue;
        }
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
