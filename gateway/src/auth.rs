//! Who calls, and what they may do, as the cluster says: a bearer token is
//! checked with a TokenReview, each permission with a SubjectAccessReview
//! on the session (`create` on `agentsessions/call` or
//! `agentsessions/approve`, virtual subresources that exist only in RBAC
//! rules). Both answers are cached with a bound on size and age, and the
//! reviews in flight are bounded, so a flood of tokens cannot flood the API
//! server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::address::SessionAddr;
use crate::cache::Bounded;
use crate::error::{Error, Result};

/// The longest bearer token looked at; longer is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How long an accepted token is trusted without asking again.
const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without asking again.
const REFUSED_TTL: Duration = Duration::from_secs(10);
/// How long a permission answer is kept.
const ACCESS_TTL: Duration = Duration::from_secs(10);
/// Reviews sent to the API server at once.
const REVIEWS_IN_FLIGHT: usize = 64;

/// The caller, as the API server authenticated them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a caller asks to do with a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Call tools, list them, stream, attach, cancel.
    Call,
    /// Approve an `always_ask` call.
    Approve,
}

impl Permission {
    pub fn subresource(self) -> &'static str {
        match self {
            Permission::Call => "call",
            Permission::Approve => "approve",
        }
    }
}

/// TokenReview and SubjectAccessReview, cached.
pub struct Auth {
    client: Client,
    audiences: Vec<String>,
    tokens: Bounded<[u8; 32], Option<Caller>>,
    access: Bounded<(Caller, SessionAddr, Permission), bool>,
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .field("access", &self.access.len())
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub fn new(client: Client, audiences: Vec<String>, cache_entries: usize) -> Self {
        Self {
            client,
            audiences,
            tokens: Bounded::new(cache_entries),
            access: Bounded::new(cache_entries),
            in_flight: Arc::new(Semaphore::new(REVIEWS_IN_FLIGHT)),
        }
    }

    /// One of the reviews allowed in flight at once.
    async fn review_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.in_flight
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("the gateway is shutting down".into()))
    }

    /// The caller behind an `Authorization` header value.
    pub async fn authenticate(&self, header: Option<&str>) -> Result<Caller> {
        let token = bearer(header)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(known) = self.tokens.get(&key, now) {
            return known.ok_or_else(refused);
        }
        let _permit = self.review_slot().await?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::Unavailable(format!("cannot check the token with the API server: {e}"))
            })?;
        let status = answer.status.unwrap_or_default();
        let caller = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(Caller {
                user: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        let ttl = if caller.is_some() {
            TOKEN_TTL
        } else {
            REFUSED_TTL
        };
        self.tokens.put(key, caller.clone(), ttl, Instant::now());
        caller.ok_or_else(refused)
    }

    /// Whether `caller` holds `permission` on the session at `addr`; an
    /// error naming the permission if not.
    pub async fn authorize(
        &self,
        caller: &Caller,
        addr: &SessionAddr,
        permission: Permission,
    ) -> Result<()> {
        let key = (caller.clone(), addr.clone(), permission);
        let allowed = match self.access.get(&key, Instant::now()) {
            Some(a) => a,
            None => {
                let a = self.review(caller, addr, permission).await?;
                self.access.put(key, a, ACCESS_TTL, Instant::now());
                a
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Error::Forbidden {
                user: caller.user.clone(),
                verb: "create",
                subresource: permission.subresource(),
                namespace: addr.namespace.clone(),
                name: addr.name.clone(),
            })
        }
    }

    async fn review(
        &self,
        caller: &Caller,
        addr: &SessionAddr,
        permission: Permission,
    ) -> Result<bool> {
        let _permit = self.review_slot().await?;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.user.clone()),
                uid: (!caller.uid.is_empty()).then(|| caller.uid.clone()),
                groups: Some(caller.groups.clone()),
                extra: (!caller.extra.is_empty()).then(|| caller.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(addr.namespace.clone()),
                    verb: Some("create".into()),
                    group: Some("agentplane.dev".into()),
                    resource: Some("agentsessions".into()),
                    subresource: Some(permission.subresource().into()),
                    name: Some(addr.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::Unavailable(format!(
                    "cannot check the permission with the API server: {e}"
                ))
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

fn refused() -> Error {
    Error::Unauthenticated(
        "the bearer token was not accepted by the cluster (expired, revoked or for another audience)"
            .into(),
    )
}

/// The token of `Authorization: Bearer <token>`.
pub fn bearer(header: Option<&str>) -> Result<&str> {
    let Some(h) = header else {
        return Err(Error::Unauthenticated(
            "no credentials: send Authorization: Bearer <a Kubernetes token>".into(),
        ));
    };
    if h.len() > MAX_TOKEN_BYTES + 7 {
        return Err(Error::Unauthenticated(format!(
            "the Authorization header is longer than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    let token = h
        .strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Error::Unauthenticated("the Authorization header is not \"Bearer <token>\"".into())
        })?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc")).ok(), Some("abc"));
        for bad in [None, Some("Basic abc"), Some("Bearer "), Some("abc")] {
            assert!(
                matches!(bearer(bad), Err(Error::Unauthenticated(_))),
                "{bad:?}"
            );
        }
        let huge = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 100));
        assert!(bearer(Some(&huge)).is_err());
    }
}
