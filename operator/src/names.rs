//! The names of a session's objects (pod, toolset ConfigMap, workspace
//! claim, NetworkPolicy) and the value of its session label.
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
use sha2::{Digest, Sha256};

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
            (
                crate::session::pod::SESSION_LABEL.to_owned(),
                self.label.clone(),
            ),
        ])
    }

    /// The label that selects the session's sandbox pod.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(
            crate::session::pod::SESSION_LABEL.to_owned(),
            self.label.clone(),
        )])
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
