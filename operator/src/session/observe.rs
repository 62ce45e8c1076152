//! What a session reconcile reads before it plans: the objects under the
//! session's names (the ConfigMap, claim and NetworkPolicy as metadata
//! only), its pods, and -- once, for an old long-named session -- which
//! naming scheme its objects were made under.

use crds::AgentSession;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::names::{self, Names, Scheme, owned_by};
use crate::resolution::Resolution;
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
/// (the ConfigMap and claim as metadata only).
pub async fn observe(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
    res: &Resolution,
) -> Result<Observed> {
    let names = Names::of(session);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let warm_pool = session.spec.warm_pool.is_some();
    // Independent reads, issued together: each is a round trip, and a warm
    // claim is judged by how few of those it waits on.
    let listed = async {
        if warm_pool {
            session_pods(&pods, session).await
        } else {
            Ok(Vec::new())
        }
    };
    let wants_claim = res.runner.is_some() && pod::workspace_claim(session).is_some();
    let claim = async {
        if !wants_claim {
            return Ok(None);
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(
            claims
                .get_metadata_opt(&names.claim)
                .await?
                .map(|m| m.metadata),
        )
    };
    let network_policy = async {
        let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(
            nps.get_metadata_opt(&names.network_policy)
                .await?
                .map(|m| m.metadata),
        )
    };
    let by_name = async { Ok::<_, Error>(pods.get_opt(&names.pod).await?) };
    let (by_name, listed, claim, network_policy) =
        futures::try_join!(by_name, listed, claim, network_policy)?;
    let (pod, surplus) = match by_name {
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
    };
    // A claimed warm pod mounts the ConfigMap named after itself; it is the
    // session's to write only if it is the session's (or not there yet).
    let cm_name = pod
        .as_ref()
        .filter(|p| claim::is_warm(p))
        .and_then(claim::toolset_configmap_name)
        .unwrap_or(names.configmap.clone());
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let configmap = cms.get_metadata_opt(&cm_name).await?.map(|m| m.metadata);
    Ok(Observed {
        pod,
        configmap,
        claim,
        network_policy,
        warm: None,
        surplus,
    })
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
