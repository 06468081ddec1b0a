//! The checks handlers make: one [`Authz`] per request, holding the ACL snapshot of the
//! moment (an `Arc`, no IO), the principal and the client's address. With `authorizer =
//! none` every check passes, as on a Kafka broker without an authorizer.

use std::sync::Arc;

use crate::security::acl::{AclSnapshot, Operation, ResourceType, CLUSTER_NAME};
use crate::security::AclStore;
use crate::server::Broker;
use crate::RequestContext;

pub(crate) use crate::security::acl::{Operation as Op, ResourceType as Res};

/// One request's authorization checks.
pub(crate) struct Authz<'a> {
    acls: Option<(&'a AclStore, Arc<AclSnapshot>)>,
    principal: String,
    host: String,
}

impl Broker {
    /// The checks for `ctx`'s request.
    pub(crate) fn authz(&self, ctx: &RequestContext) -> Authz<'_> {
        Authz {
            acls: self.acls.as_deref().map(|store| (store, store.snapshot())),
            principal: ctx.principal.to_string(),
            // An IPv4 client on a dual-stack socket shows as ::ffff:a.b.c.d; ACL hosts are
            // written as Kafka prints the address, a.b.c.d.
            host: ctx.peer.ip().to_canonical().to_string(),
        }
    }
}

impl Authz<'_> {
    /// Whether an authorizer is configured at all.
    pub(crate) fn enabled(&self) -> bool {
        self.acls.is_some()
    }

    fn check(&self, operation: Operation, resource_type: ResourceType, name: &str) -> bool {
        match &self.acls {
            None => true,
            Some((store, snapshot)) => snapshot.authorize(
                store.config(),
                &self.principal,
                &self.host,
                operation,
                resource_type,
                name,
            ),
        }
    }

    /// Whether the request may do `operation` on the resource; a refusal is counted.
    pub(crate) fn allows(
        &self,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        let allowed = self.check(operation, resource_type, name);
        if !allowed {
            if let Some((store, _)) = &self.acls {
                store.count_denied(resource_type, operation);
            }
        }
        allowed
    }

    /// As [`allows`](Self::allows), for filtering what a listing shows (Metadata of every
    /// topic, ListGroups): not counted, since hiding is not refusing.
    pub(crate) fn shows(
        &self,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        self.check(operation, resource_type, name)
    }

    /// `operation` on the cluster resource.
    pub(crate) fn allows_cluster(&self, operation: Operation) -> bool {
        self.allows(operation, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// Whether the request may do `operation` on some resource of `resource_type` (Kafka's
    /// `authorizeByResourceType`).
    pub(crate) fn allows_any(&self, operation: Operation, resource_type: ResourceType) -> bool {
        match &self.acls {
            None => true,
            Some((store, snapshot)) => {
                let allowed = snapshot.authorize_any(
                    store.config(),
                    &self.principal,
                    &self.host,
                    operation,
                    resource_type,
                );
                if !allowed {
                    store.count_denied(resource_type, operation);
                }
                allowed
            }
        }
    }
}

impl Authz<'_> {
    /// Of the operations in the bit set `all` (Kafka's `*_authorized_operations`, bit n for
    /// operation code n), those the request may do on the resource.
    pub(crate) fn operations(&self, resource_type: ResourceType, name: &str, all: i32) -> i32 {
        if !self.enabled() {
            return all;
        }
        Operation::EVERY
            .into_iter()
            .filter(|o| all & (1 << o.code()) != 0 && self.check(*o, resource_type, name))
            .fold(0, |acc, o| acc | (1 << o.code()))
    }

    /// Kafka's right to create a topic: CREATE on the cluster or on the topic.
    pub(crate) fn may_create_topic(&self, name: &str) -> bool {
        if self.check(Operation::Create, ResourceType::Cluster, CLUSTER_NAME)
            || self.check(Operation::Create, ResourceType::Topic, name)
        {
            return true;
        }
        self.allows(Operation::Create, ResourceType::Topic, name)
    }
}
