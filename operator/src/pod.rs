//! The sandbox pod, built as pure data from a session.
//!
//! The runner must run inside the sandbox container, so that bash, grep and
//! the file tools all see the agent image's own filesystem: an init
//! container from the runner image copies the static runner binary into an
//! emptyDir, and the sandbox container (the session's image) starts it as
//! its process. The runner is PID 1 there and reaps orphans as a subreaper.

use std::collections::BTreeMap;

use crds::{AgentSession, RUNNER_PORT, RUNNER_SOCKET};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar,
    ExecAction, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext,
    PodSpec, Probe, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use sha2::{Digest, Sha256};
use toolset::ResolvedToolset;

/// Label naming the session a pod belongs to.
pub const SESSION_LABEL: &str = "agentplane.dev/session";
/// Annotation carrying the hash of the pod spec the operator built, so a
/// changed session replaces its pod (pod specs are mostly immutable).
pub const SPEC_HASH_ANNOTATION: &str = "agentplane.dev/spec-hash";
/// Where the runner binary is installed inside the sandbox container.
pub const RUNNER_BIN: &str = "/opt/agentplane/bin/agent-sidecar";
/// Where the resolved toolset is mounted.
pub const TOOLSET_DIR: &str = "/etc/agentplane";
/// The file name of the resolved toolset inside [`TOOLSET_DIR`].
pub const TOOLSET_FILE: &str = "toolset.json";
/// The non-root identity sandbox processes run as.
pub const SANDBOX_UID: i64 = 65532;

/// What the operator's deployment decides about every sandbox pod.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// Image holding the static runner at `/agent-sidecar`.
    pub runner_image: String,
    /// Pull policy for both images (IfNotPresent unless told otherwise).
    pub image_pull_policy: String,
}

/// Deterministic names of a session's objects. Kubernetes names are at most
/// 253 characters and label values 63; a long session name is cut and given
/// a hash suffix so two long names never collide.
pub fn object_name(session: &str, suffix: &str) -> String {
    let full = format!("{session}-{suffix}");
    if full.len() <= 63 {
        return full;
    }
    let digest = hex::encode(&Sha256::digest(session.as_bytes())[..4]);
    let keep = 63 - suffix.len() - digest.len() - 2;
    let head = session[..keep.min(session.len())].trim_end_matches(['-', '.']);
    format!("{head}-{digest}-{suffix}")
}

/// The sandbox pod's name.
pub fn pod_name(session: &str) -> String {
    object_name(session, "sandbox")
}

/// The resolved toolset ConfigMap's name.
pub fn toolset_configmap_name(session: &str) -> String {
    object_name(session, "toolset")
}

/// The workspace claim's name.
pub fn workspace_claim_name(session: &str) -> String {
    object_name(session, "workspace")
}

fn labels(session: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            "agentplane-sandbox".to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "agentplane".to_owned(),
        ),
        (SESSION_LABEL.to_owned(), label_value(session)),
    ])
}

/// A label value for `s` (at most 63 characters).
fn label_value(s: &str) -> String {
    if s.len() <= 63 {
        s.to_owned()
    } else {
        object_name(s, "x")
    }
}

fn owner(session: &AgentSession) -> Option<OwnerReference> {
    session.controller_owner_ref(&())
}

fn meta(session: &AgentSession, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: session.metadata.namespace.clone(),
        labels: Some(labels(session.metadata.name.as_deref().unwrap_or_default())),
        owner_references: owner(session).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// The ConfigMap holding the runner's resolved toolset. Mounted rather than
/// baked into the pod spec, so that a policy change reaches the running
/// runner without replacing the pod (and its workspace).
pub fn toolset_configmap(session: &AgentSession, resolved: &ResolvedToolset) -> ConfigMap {
    let name = session.metadata.name.as_deref().unwrap_or_default();
    ConfigMap {
        metadata: meta(session, toolset_configmap_name(name)),
        data: Some(BTreeMap::from([(
            TOOLSET_FILE.to_owned(),
            serde_json::to_string_pretty(resolved).unwrap_or_default(),
        )])),
        ..ConfigMap::default()
    }
}

/// The workspace claim, when the session asks for a persistent workspace.
pub fn workspace_claim(session: &AgentSession) -> Option<PersistentVolumeClaim> {
    let template = session
        .spec
        .workspace
        .as_ref()?
        .volume_claim_template
        .as_ref()?;
    let name = session.metadata.name.as_deref().unwrap_or_default();
    Some(PersistentVolumeClaim {
        metadata: meta(session, workspace_claim_name(name)),
        spec: Some(template.spec.clone()),
        ..PersistentVolumeClaim::default()
    })
}

fn hardened() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        run_as_non_root: Some(true),
        run_as_user: Some(SANDBOX_UID),
        run_as_group: Some(SANDBOX_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// The sandbox pod of a session, carrying the hash of its own spec.
pub fn build_pod(session: &AgentSession, cfg: &PodConfig) -> Pod {
    let name = session.metadata.name.as_deref().unwrap_or_default();
    let spec = &session.spec;

    let workspace = match spec.workspace.as_ref() {
        Some(w) if w.volume_claim_template.is_some() => Volume {
            name: "workspace".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: workspace_claim_name(name),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        },
        w => Volume {
            name: "workspace".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: w
                    .and_then(|w| w.empty_dir.as_ref())
                    .and_then(|e| e.size_limit.clone()),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        },
    };

    let mut env = vec![EnvVar {
        name: "HOME".to_owned(),
        value: Some(spec.workdir.clone()),
        ..EnvVar::default()
    }];
    env.retain(|e| !spec.env.iter().any(|u| u.name == e.name));
    env.extend(spec.env.iter().cloned());

    let mut args = vec![
        "serve".to_owned(),
        "--socket".to_owned(),
        RUNNER_SOCKET.to_owned(),
        "--listen".to_owned(),
        format!("127.0.0.1:{RUNNER_PORT}"),
        "--workdir".to_owned(),
        spec.workdir.clone(),
        "--toolset".to_owned(),
        format!("{TOOLSET_DIR}/{TOOLSET_FILE}"),
        "--session".to_owned(),
        name.to_owned(),
        "--state-dir".to_owned(),
        "/run/agent/state".to_owned(),
        "--spill-dir".to_owned(),
        "/run/agent/output".to_owned(),
    ];
    if let Some(idle) = spec.lifetime.as_ref().and_then(|l| l.idle_timeout_seconds) {
        args.push("--idle-timeout-seconds".to_owned());
        args.push(idle.to_string());
    }

    let install = Container {
        name: "install-runner".to_owned(),
        image: Some(cfg.runner_image.clone()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(vec![
            "/agent-sidecar".to_owned(),
            "install".to_owned(),
            RUNNER_BIN.to_owned(),
        ]),
        volume_mounts: Some(vec![mount("agent-bin", "/opt/agentplane/bin", false)]),
        security_context: Some(hardened()),
        ..Container::default()
    };
    let sandbox = Container {
        name: "sandbox".to_owned(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(vec![RUNNER_BIN.to_owned()]),
        args: Some(args),
        working_dir: Some(spec.workdir.clone()),
        env: Some(env),
        resources: spec.resources.clone(),
        volume_mounts: Some(vec![
            mount("agent-bin", "/opt/agentplane/bin", true),
            mount("agent-run", "/run/agent", false),
            mount("toolset", TOOLSET_DIR, true),
            mount("workspace", &spec.workdir, false),
            mount("tmp", "/tmp", false),
        ]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    RUNNER_BIN.to_owned(),
                    "health".to_owned(),
                    "--socket".to_owned(),
                    RUNNER_SOCKET.to_owned(),
                ]),
            }),
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            ..Probe::default()
        }),
        security_context: Some(hardened()),
        ..Container::default()
    };

    let pod_spec = PodSpec {
        init_containers: Some(vec![install]),
        containers: vec![sandbox],
        volumes: Some(vec![
            empty_dir("agent-bin"),
            empty_dir("agent-run"),
            empty_dir("tmp"),
            Volume {
                name: "toolset".to_owned(),
                config_map: Some(ConfigMapVolumeSource {
                    name: toolset_configmap_name(name),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            workspace,
        ]),
        // A crash restarts the runner in place (its bash state survives in
        // the agent-run emptyDir); an idle exit (code 0) ends the session.
        restart_policy: Some("OnFailure".to_owned()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        active_deadline_seconds: spec
            .lifetime
            .as_ref()
            .and_then(|l| l.active_deadline_seconds),
        runtime_class_name: spec.runtime_class_name.clone(),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        termination_grace_period_seconds: Some(30),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            fs_group: Some(SANDBOX_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        ..PodSpec::default()
    };

    let hash = spec_hash(&pod_spec);
    let mut metadata = meta(session, pod_name(name));
    metadata.annotations = Some(BTreeMap::from([(SPEC_HASH_ANNOTATION.to_owned(), hash)]));
    Pod {
        metadata,
        spec: Some(pod_spec),
        ..Pod::default()
    }
}

/// A stable digest of a pod spec.
pub fn spec_hash(spec: &PodSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}
