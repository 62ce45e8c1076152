//! The names, labels, annotations and owner references of every object
//! the operator writes: a session's pod, toolset ConfigMap, workspace
//! claim and NetworkPolicy, and a warm pool's pods. One module, so that
//! what marks an object as the platform's is decided in one place and
//! every wing reads it from here.
//!
//! Names are deterministic so that an interrupted reconcile converges, and
//! at most 63 characters (a pod's name is its hostname). A session name too
//! long for that is cut and given a digest of the whole name: 128 bits of
//! SHA-256, so two names that map to the same objects cannot be searched
//! for. A collision would still not be a takeover -- objects are adopted and
//! deleted only by owner UID (`plan::owned_by`) -- but a session must never
//! be locked out of its own names by someone else's choice of name.
//!
//! Releases before this one used a 32-bit digest. A session whose objects
//! were made under those names keeps them (its workspace claim, and its
//! emptyDir workspace inside the running pod, are not renamed away): the
//! controller finds them on its first look and records the scheme in
//! `status.objectNames`; everything else uses the current scheme.

use std::collections::BTreeMap;

use crds::AgentSession;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use sha2::{Digest, Sha256};

/// The operator's field manager for server-side apply.
pub const FIELD_MANAGER: &str = "agentplane-operator";

/// Label naming the session a pod belongs to.
pub const SESSION_LABEL: &str = "agentplane.dev/session";
/// Annotation carrying the hash of the pod spec the operator built, so a
/// changed session replaces its pod (pod specs are mostly immutable).
pub const SPEC_HASH_ANNOTATION: &str = "agentplane.dev/spec-hash";
/// Label of a pool's unclaimed pods: the pool's name (fitted to a label).
pub const POOL_LABEL: &str = "agentplane.dev/pool";
/// Annotation of a pool's pods: the hash of the template they were built
/// from, so a changed template replaces the unclaimed ones.
pub const TEMPLATE_HASH_ANNOTATION: &str = "agentplane.dev/template-hash";
/// Annotation every warm pod keeps for life, naming its pool: it marks the
/// pod as one whose runner awaits a binding in the ConfigMap it mounts.
pub const WARM_ANNOTATION: &str = "agentplane.dev/warm-pool";
/// Annotation the operator writes on a claimed pod after writing its
/// binding: the hash of the ConfigMap's data. The pod update it makes is
/// what has the kubelet refresh the mounted ConfigMap at once instead of at
/// its next periodic sync (up to a minute later).
pub const BOUND_ANNOTATION: &str = "agentplane.dev/bound";

/// The pool label's value for the pool called `pool`.
pub fn pool_label(pool: &str) -> String {
    Names::with(pool, Scheme::Current).label
}

/// A name fitted to a label value (a long one shortened with a digest),
/// as pool and checkpoint labels carry it.
pub fn label_value(name: &str) -> String {
    Names::with(name, Scheme::Current).label
}

/// The label selector of a pool's unclaimed pods, as the scale subresource
/// and `kubectl get pods -l` take it.
pub fn pool_selector(pool: &str) -> String {
    format!("{POOL_LABEL}={}", pool_label(pool))
}

/// `status.objectNames` of a session whose objects carry 32-bit digests.
pub const DIGEST32: &str = "digest32";

/// The longest object name the operator makes.
const MAX_NAME: usize = 63;

/// How long-name digests are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// 128-bit digests.
    Current,
    /// 32-bit digests, kept for sessions whose objects already use them.
    Digest32,
}

impl Scheme {
    /// The scheme a session's status records (the current one when none).
    pub fn of(session: &AgentSession) -> Self {
        match session
            .status
            .as_ref()
            .and_then(|s| s.object_names.as_deref())
        {
            Some(DIGEST32) => Self::Digest32,
            _ => Self::Current,
        }
    }

    /// What `status.objectNames` says for this scheme.
    pub fn recorded(self) -> Option<String> {
        match self {
            Self::Current => None,
            Self::Digest32 => Some(DIGEST32.to_owned()),
        }
    }

    fn digest_bytes(self) -> usize {
        match self {
            Self::Current => 16,
            Self::Digest32 => 4,
        }
    }
}

/// Every name one session's objects go by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub pod: String,
    pub configmap: String,
    pub claim: String,
    pub network_policy: String,
    /// The value of the session label on each object (label values are at
    /// most 63 characters, too).
    pub label: String,
}

impl Names {
    /// The names of `session`'s objects, in the scheme its status records.
    pub fn of(session: &AgentSession) -> Self {
        Self::with(
            session.metadata.name.as_deref().unwrap_or_default(),
            Scheme::of(session),
        )
    }

    /// The names of the session called `session` under `scheme`.
    pub fn with(session: &str, scheme: Scheme) -> Self {
        let name = |suffix| object_name_in(session, suffix, scheme);
        Self {
            pod: name("sandbox"),
            configmap: name("toolset"),
            claim: name("workspace"),
            network_policy: name("egress"),
            label: if session.len() <= MAX_NAME {
                session.to_owned()
            } else {
                name("x")
            },
        }
    }

    /// The labels every object of the session carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "app.kubernetes.io/name".to_owned(),
                "agentplane-sandbox".to_owned(),
            ),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "agentplane".to_owned(),
            ),
            (SESSION_LABEL.to_owned(), self.label.clone()),
        ])
    }

    /// The label that selects the session's sandbox pod.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(SESSION_LABEL.to_owned(), self.label.clone())])
    }
}

/// `{session}-{suffix}`, or for a long session name its head, a digest of
/// the whole name and the suffix, in the current scheme.
pub fn object_name(session: &str, suffix: &str) -> String {
    object_name_in(session, suffix, Scheme::Current)
}

fn object_name_in(session: &str, suffix: &str, scheme: Scheme) -> String {
    let full = format!("{session}-{suffix}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let digest = hex::encode(&Sha256::digest(session.as_bytes())[..scheme.digest_bytes()]);
    let keep = MAX_NAME - suffix.len() - digest.len() - 2;
    // Session names are DNS subdomains (ASCII); cut on a char boundary all
    // the same rather than trust that.
    let mut cut = keep.min(session.len());
    while !session.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = session[..cut].trim_end_matches(['-', '.']);
    format!("{head}-{digest}-{suffix}")
}

/// Metadata of an object the session owns: its name, the session's
/// labels, and the session as controlling owner.
pub fn owned_meta(session: &AgentSession, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: session.metadata.namespace.clone(),
        labels: Some(Names::of(session).labels()),
        owner_references: owner(session).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

fn owner(session: &AgentSession) -> Option<OwnerReference> {
    session.controller_owner_ref(&())
}

/// Whether `meta` names `session` as its controlling owner, by UID: a name
/// alone could be another session's object (or anyone's), and adopting or
/// deleting it would be a takeover.
pub fn owned_by(meta: &ObjectMeta, session: &AgentSession) -> bool {
    controlled_by(meta, session.metadata.uid.as_deref())
}

/// Whether `meta` names the object with `uid` (a session, a pool) as its
/// controlling owner; never for an owner without a UID.
pub fn controlled_by(meta: &ObjectMeta, uid: Option<&str>) -> bool {
    let Some(uid) = uid else {
        return false;
    };
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_plain_in_both_schemes() {
        for scheme in [Scheme::Current, Scheme::Digest32] {
            let n = Names::with("demo", scheme);
            assert_eq!(n.pod, "demo-sandbox");
            assert_eq!(n.claim, "demo-workspace");
            assert_eq!(n.label, "demo");
        }
    }

    #[test]
    fn long_names_carry_a_128_bit_digest_and_fit() {
        let long = "a".repeat(200);
        let n = Names::with(&long, Scheme::Current);
        for name in [&n.pod, &n.configmap, &n.claim, &n.network_policy, &n.label] {
            assert!(name.len() <= MAX_NAME, "{name}");
            let digest = name.split('-').nth(1).expect("digest");
            assert_eq!(digest.len(), 32, "{name}");
        }
        let old = Names::with(&long, Scheme::Digest32);
        assert_ne!(n.claim, old.claim);
        assert_eq!(old.claim.split('-').nth(1).map(str::len), Some(8));
    }
}
