//! The API calls of a warm claim: find the session's pool, pick candidates
//! from the pool controller's cache, and take one pod with the single
//! preconditioned patch [`claim`](crate::session::claim) builds. The rules
//! (what may be claimed, the patch itself) are that module's, as pure data.

use crds::{AgentSession, AgentWarmPool};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::context::{Context, apply_params, key};
use crate::error::{Error, Result};
use crate::names;
use crate::resolution::CondSpec;
use crate::session::claim;
use crate::session::egress;
use crate::session::written::{self, Written};

/// Most pods one claim tries before the session starts cold: each failed
/// try is another session's claim of the same pod.
const CLAIM_TRIES: usize = 8;

/// Tries to take a ready pod from the session's pool `pool_name`. On
/// success the pod is the session's (see [`claim`] for why this is a single
/// preconditioned patch; its `WarmPool` condition is derived from it);
/// otherwise the condition that says why the session starts cold.
///
/// The session's NetworkPolicy is applied first; its metadata goes into
/// `network_policy` and the apply into `written`, so that the reconcile's
/// own apply of the same policy is skipped (one request fewer per claim).
pub async fn claim(
    ctx: &Context,
    written: &Written,
    ns: &str,
    session: &AgentSession,
    pool_name: &str,
    network_policy: &mut Option<ObjectMeta>,
) -> Result<std::result::Result<Pod, CondSpec>> {
    let (pool, applied) = pool_behind_policy(ctx, written, ns, session, pool_name).await?;
    if applied.is_some() {
        *network_policy = applied;
    }
    let Some(pool) = pool else {
        return Ok(Err(cold(
            "PoolNotFound",
            format!(
                "spec.warmPool: no AgentWarmPool {pool_name:?} in namespace {ns}; started cold"
            ),
        )));
    };
    if let Some(why) = claim::mismatch(&session.spec, &pool.spec.template) {
        return Ok(Err(cold(
            "TemplateMismatch",
            format!("{why}; started cold"),
        )));
    }
    let mut candidates = candidates(ctx, ns, &pool, pool_name).await?;
    if candidates.is_empty() {
        return Ok(Err(cold(
            "PoolExhausted",
            format!("AgentWarmPool {pool_name} has no ready pod; started cold"),
        )));
    }
    // Concurrent claims spread over the pool instead of all racing for its
    // first pod: each starts at a different place.
    let start = session_spread(session, candidates.len());
    candidates.rotate_left(start);
    if let Some(pod) = take_one(ctx, ns, session, &pool, &candidates).await? {
        return Ok(Ok(pod));
    }
    Ok(Err(cold(
        "PoolExhausted",
        format!(
            "every ready pod of AgentWarmPool {pool_name} was claimed by other sessions first; started cold"
        ),
    )))
}

/// Looks the pool up (cache first) while applying the session's
/// NetworkPolicy: it exists before the pod carries the session's label (it
/// is the session's anyway, claim or not). Returns the pool and the
/// applied policy's metadata.
async fn pool_behind_policy(
    ctx: &Context,
    written: &Written,
    ns: &str,
    session: &AgentSession,
    pool_name: &str,
) -> Result<(Option<AgentWarmPool>, Option<ObjectMeta>)> {
    let network_policy = async {
        let Some(np) = egress::network_policy(session, &ctx.pods.egress) else {
            return Ok::<_, Error>(None);
        };
        let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        let name = np.name_any();
        let applied = nps
            .patch(&name, &apply_params(), &Patch::Apply(&np))
            .await?;
        written.record(
            "NetworkPolicy",
            ns,
            &name,
            applied.metadata.resource_version.clone(),
            written::digest(&np),
        );
        Ok(Some(applied.metadata))
    };
    let pool = async {
        let cached = ctx
            .pools
            .get()
            .and_then(|store| store.get(&ObjectRef::<AgentWarmPool>::new(pool_name).within(ns)));
        if let Some(pool) = cached {
            return Ok(Some(AgentWarmPool::clone(&pool)));
        }
        let pools: Api<AgentWarmPool> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(pools.get_opt(pool_name).await?)
    };
    let (applied, pool) = futures::try_join!(network_policy, pool)?;
    Ok((pool, applied))
}

/// The pool's claimable pods, from the pool controller's cache, or listed
/// when the cache has none (its watch may not have listed yet: a restarted
/// operator).
async fn candidates(
    ctx: &Context,
    ns: &str,
    pool: &AgentWarmPool,
    pool_name: &str,
) -> Result<Vec<Pod>> {
    let cached: Vec<Pod> = ctx
        .pool_pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns) && claim::claimable(p, pool))
        .map(|p| Pod::clone(p))
        .collect();
    if !cached.is_empty() {
        return Ok(cached);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods
        .list(&kube::api::ListParams::default().labels(&names::pool_selector(pool_name)))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| claim::claimable(p, pool))
        .collect())
}

/// Patches candidates in turn until one claim lands; at most
/// [`CLAIM_TRIES`]. A 409 or 404 is another session's claim first (or a
/// pod gone): the next candidate is tried.
async fn take_one(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
    pool: &AgentWarmPool,
    candidates: &[Pod],
) -> Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for candidate in candidates.iter().take(CLAIM_TRIES) {
        let Some(patch) = claim::claim_patch(candidate, session, &ctx.pods) else {
            continue;
        };
        let name = candidate.name_any();
        match pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(pod) => {
                ctx.wake_pool(pool);
                tracing::info!(session = %key(session), pod = %name, pool = %pool.name_any(), "claimed a warm pod");
                return Ok(Some(pod));
            }
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

fn cold(reason: &str, message: String) -> CondSpec {
    CondSpec {
        type_: "WarmPool",
        status: false,
        reason: reason.into(),
        message,
    }
}

/// Where in a list of `n` candidates this session starts, from its UID.
fn session_spread(session: &AgentSession, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    session.metadata.uid.hash(&mut h);
    usize::try_from(h.finish() % (n.max(1) as u64)).unwrap_or(0)
}
