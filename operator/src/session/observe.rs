//! What a session reconcile reads before it plans: the objects under the
//! session's names (the ConfigMap, claim and NetworkPolicy as metadata
//! only), its pods, and -- once, for an old long-named session -- which
//! naming scheme its objects were made under.

use crds::AgentSession;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::names::{self, Names, Scheme, owned_by};
use crate::resolution::Resolution;
use crate::session::cache::Caches;
use crate::session::claim;
use crate::session::plan::Observed;
use crate::session::pod;

/// For a session with no naming scheme recorded whose name is long enough
/// for the schemes to differ: the earlier scheme, when its pod or workspace
/// claim exists under the earlier names and belongs to the session (see
/// [`crate::names`]). Probed once; the status records the answer.
pub async fn earlier_scheme(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
) -> Result<Option<Scheme>> {
    if session
        .status
        .as_ref()
        .is_some_and(|s| s.object_names.is_some())
    {
        return Ok(None);
    }
    let name = session.name_any();
    let (now, old) = (
        Names::with(&name, Scheme::Current),
        Names::with(&name, Scheme::Digest32),
    );
    if now == old {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let found = [
        pods.get_metadata_opt(&old.pod).await?.map(|m| m.metadata),
        claims
            .get_metadata_opt(&old.claim)
            .await?
            .map(|m| m.metadata),
    ];
    let ours = found.iter().flatten().any(|m| owned_by(m, session));
    Ok(ours.then_some(Scheme::Digest32))
}

/// Reads what the plan depends on: the objects under the session's names
/// (the ConfigMap, claim and NetworkPolicy as metadata only), from the
/// controller's caches where they hold them and from the API server where
/// they do not (see [`crate::session::cache`]).
pub async fn observe(
    ctx: &Context,
    caches: &Caches,
    ns: &str,
    session: &AgentSession,
    res: &Resolution,
) -> Result<Observed> {
    let names = Names::of(session);
    let cached = caches.ready();
    // Independent reads, issued together: each is a round trip, and a warm
    // claim is judged by how few of those it waits on.
    let pods = session_pod(ctx, cached.then_some(caches), ns, session);
    let wants_claim = res.runner.is_some() && pod::workspace_claim(session, None).is_some();
    let claim = async {
        if !wants_claim {
            return Ok(None);
        }
        let hit = cached.then(|| caches.claim(ns, &names.claim)).flatten();
        metadata::<PersistentVolumeClaim>(ctx, ns, &names.claim, hit).await
    };
    let network_policy = async {
        let hit = cached
            .then(|| caches.network_policy(ns, &names.network_policy))
            .flatten();
        metadata::<NetworkPolicy>(ctx, ns, &names.network_policy, hit).await
    };
    let ((pod, surplus), claim, network_policy) = futures::try_join!(pods, claim, network_policy)?;
    // A claimed warm pod mounts the ConfigMap named after itself; it is the
    // session's to write only if it is the session's (or not there yet).
    let cm_name = pod
        .as_ref()
        .filter(|p| claim::is_warm(p))
        .and_then(claim::toolset_configmap_name)
        .unwrap_or(names.configmap.clone());
    let hit = cached.then(|| caches.configmap(ns, &cm_name)).flatten();
    let configmap = metadata::<ConfigMap>(ctx, ns, &cm_name, hit).await?;
    Ok(Observed {
        pod,
        configmap,
        claim,
        network_policy,
        surplus,
        ..Observed::default()
    })
}

/// The pod the session runs in and its surplus pods (see [`claim::pick`]),
/// from the caches when given and they hold it.
async fn session_pod(
    ctx: &Context,
    caches: Option<&Caches>,
    ns: &str,
    session: &AgentSession,
) -> Result<(Option<Pod>, Vec<(String, Option<String>)>)> {
    let names = Names::of(session);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let warm_pool = session.spec.warm_pool.is_some();
    let cached_pod = caches.and_then(|c| c.pod(ns, &names.pod));
    // A warm session's pods (a claimed one has the pool's name; two
    // operators racing may leave it two) come from the cache's session
    // index; none there may be a watch that has not caught up, so the API
    // server is asked.
    let cached: Vec<Pod> = caches
        .filter(|_| warm_pool)
        .map(|c| c.session_pods(ns, session))
        .unwrap_or_default();
    let indexed = !cached.is_empty();
    let listed = async {
        match cached {
            _ if !warm_pool => Ok(Vec::new()),
            found if indexed => Ok(found),
            _ => session_pods(&pods, session).await,
        }
    };
    let by_name = async {
        match cached_pod {
            Some(pod) => Ok(Some(pod)),
            // The index holds every labelled pod, the session's own name
            // among them: not there is not there (for as long as the watch
            // takes to catch up, which wakes the session again).
            None if indexed => Ok(None),
            None => Ok::<_, Error>(pods.get_opt(&names.pod).await?),
        }
    };
    let (by_name, listed) = futures::try_join!(by_name, listed)?;
    Ok(match by_name {
        // Someone else's pod under the session's name: the plan reports it.
        Some(p) if !owned_by(&p.metadata, session) => (Some(p), Vec::new()),
        by_name if warm_pool => {
            let mut all = listed;
            if let Some(p) = by_name
                && !all.iter().any(|q| q.metadata.uid == p.metadata.uid)
            {
                all.push(p);
            }
            claim::pick(all)
        }
        by_name => (by_name, Vec::new()),
    })
}

/// The metadata of `ns/name`: the cache's `hit`, or else the API server's
/// answer (a miss may be a watch that has not caught up).
async fn metadata<K>(
    ctx: &Context,
    ns: &str,
    name: &str,
    hit: Option<ObjectMeta>,
) -> Result<Option<ObjectMeta>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if hit.is_some() {
        return Ok(hit);
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api.get_metadata_opt(name).await?.map(|m| m.metadata))
}

/// Every pod `session` controls, found by its session label and then
/// checked by owner UID (a label alone anyone can set): a claimed warm pod
/// has the pool's name, not the session's, and the label list is how a
/// claim interrupted right after its patch is found again.
async fn session_pods(pods: &Api<Pod>, session: &AgentSession) -> Result<Vec<Pod>> {
    let selector = format!("{}={}", names::SESSION_LABEL, Names::of(session).label);
    let listed = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| owned_by(&p.metadata, session))
        .collect())
}
