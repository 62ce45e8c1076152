//! The sandbox pod, built as pure data from a session.
//!
//! The runner must run inside the sandbox container, so that bash, grep and
//! the file tools all see the agent image's own filesystem: an init
//! container from the runner image copies the static runner binary into an
//! emptyDir, and the sandbox container (the session's image) starts it as
//! its process. The runner is PID 1 there and reaps orphans as a subreaper.
//!
//! The runner's command lines, paths and port come from `runner-api`, whose
//! types the runner's own tests parse with its command-line parser: no
//! runner flag is written here as a string.

use std::collections::BTreeMap;

use crate::checkpoint::build::{fork_state_volume, fork_volume};
use crate::checkpoint::fork::ForkSnapshot;
use crate::names::{Names, SPEC_HASH_ANNOTATION, owned_meta};
use crate::quantity;
use crate::sandbox::{DiskBounds, PodConfig, RunnerWatch};
use crds::AgentSession;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, ExecAction, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, TypedObjectReference, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use runner_api::{
    Health, IMAGE_BIN, Install, Invocation, RUN_DIR, RUNNER_LISTEN, RUNNER_SOCKET, RUNNER_TLS_DIR,
    RUNNER_TLS_PORT, SANDBOX_BIN, SANDBOX_BIN_DIR, SPILL_DIR, STATE_DIR, Serve,
};
use sha2::{Digest, Sha256};
use toolset::ResolvedToolset;

/// Where the resolved toolset is mounted.
pub const TOOLSET_DIR: &str = "/etc/agentplane";
/// The file name of the resolved toolset inside [`TOOLSET_DIR`].
pub const TOOLSET_FILE: &str = "toolset.json";
/// The container running the session's image and the runner.
pub const SANDBOX_CONTAINER: &str = "sandbox";
/// The init container that copies the runner into the sandbox pod.
pub const INSTALL_CONTAINER: &str = "install-runner";
/// The volume that carries the session's toolset (its ConfigMap).
pub const TOOLSET_VOLUME: &str = "toolset";
/// The non-root identity sandbox processes run as.
pub const SANDBOX_UID: i64 = 65532;

/// The ConfigMap holding the runner's resolved toolset. Mounted rather than
/// baked into the pod spec, so that a policy change reaches the running
/// runner without replacing the pod (and its workspace).
pub fn toolset_configmap(session: &AgentSession, resolved: &ResolvedToolset) -> ConfigMap {
    toolset_configmap_named(session, resolved, Names::of(session).configmap)
}

/// [`toolset_configmap`] under another name: a claimed warm pod mounts the
/// ConfigMap named after itself.
pub fn toolset_configmap_named(
    session: &AgentSession,
    resolved: &ResolvedToolset,
    name: String,
) -> ConfigMap {
    ConfigMap {
        metadata: owned_meta(session, name),
        data: Some(BTreeMap::from([(
            TOOLSET_FILE.to_owned(),
            serde_json::to_string_pretty(resolved).unwrap_or_default(),
        )])),
        ..ConfigMap::default()
    }
}

/// The workspace claim, when the session asks for a persistent workspace;
/// for a fork of a VolumeSnapshot checkpoint, made from that snapshot (in
/// its StorageClass, unless the template names one).
pub fn workspace_claim(
    session: &AgentSession,
    from: Option<&ForkSnapshot>,
) -> Option<PersistentVolumeClaim> {
    let template = session
        .spec
        .workspace
        .as_ref()?
        .volume_claim_template
        .as_ref()?;
    let mut spec = template.spec.clone();
    if let Some(from) = from {
        spec.storage_class_name
            .get_or_insert_with(|| from.storage_class.clone());
        spec.data_source_ref = Some(TypedObjectReference {
            api_group: Some(crate::checkpoint::volume::GROUP.to_owned()),
            kind: "VolumeSnapshot".to_owned(),
            name: from.snapshot.clone(),
            namespace: None,
        });
    }
    Some(PersistentVolumeClaim {
        metadata: owned_meta(session, Names::of(session).claim),
        spec: Some(spec),
        ..PersistentVolumeClaim::default()
    })
}

fn hardened(read_only_root: bool) -> SecurityContext {
    SecurityContext {
        read_only_root_filesystem: read_only_root.then_some(true),
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

fn empty_dir(name: &str, size_limit: Option<Quantity>) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit,
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The size limit of the emptyDir the runner binary is copied into: the
/// static binary is tens of MiB; nothing else is written there.
pub const BIN_VOLUME_SIZE: &str = "128Mi";

/// The sandbox pod of a session, carrying the hash of its own spec.
pub fn build_pod(session: &AgentSession, cfg: &PodConfig) -> Pod {
    build(session, cfg, false)
}

/// A warm pool's pod, built from the pool's template as a session without
/// tools (`crate::session::claim` gives it the pool's labels and owner): its runner
/// waits for a binding, and its toolset ConfigMap is optional, because it
/// is written only when a session claims the pod.
pub fn build_warm_pod(template: &AgentSession, cfg: &PodConfig) -> Pod {
    build(template, cfg, true)
}

fn build(session: &AgentSession, cfg: &PodConfig, warm: bool) -> Pod {
    let names = Names::of(session);
    let spec = &session.spec;
    let mut volumes = vec![
        empty_dir(BIN_VOLUME, bin_limit(cfg)),
        empty_dir(RUN_VOLUME, cfg.disk.runner.clone()),
        empty_dir("tmp", cfg.disk.tmp.clone()),
        Volume {
            name: TOOLSET_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.configmap.clone(),
                optional: warm.then_some(true),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        workspace_volume(session, cfg),
    ];
    if cfg.gateway {
        volumes.push(runner_tls_volume());
    }
    volumes.extend(fork_of(session, warm).map(|c| checkpoint_volume(session, &c).0));
    let pod_spec = PodSpec {
        init_containers: Some(vec![install_container(cfg)]),
        containers: vec![sandbox_container(session, cfg, warm)],
        volumes: Some(volumes),
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
        host_users: cfg.host_users,
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
    let mut metadata = owned_meta(session, names.pod);
    let built = BuiltWith {
        runner_image: cfg.runner_image.clone(),
        default_resources: cfg.default_resources.clone(),
        default_workspace_limit: cfg.default_workspace_limit.clone(),
        read_only_root: cfg.read_only_root,
        disk: cfg.disk.clone(),
        host_users: cfg.host_users,
        watch: cfg.watch,
        gateway: cfg.gateway,
    };
    metadata.annotations = Some(BTreeMap::from([
        (SPEC_HASH_ANNOTATION.to_owned(), hash),
        (
            BUILT_WITH_ANNOTATION.to_owned(),
            serde_json::to_string(&built).unwrap_or_default(),
        ),
    ]));
    Pod {
        metadata,
        spec: Some(pod_spec),
        ..Pod::default()
    }
}

/// The volume of the runner's certificate for the gateway: the namespace's
/// Secret the operator writes before it makes the pod. Readable by the
/// sandbox's group only; its key can serve as a runner, never call one.
fn runner_tls_volume() -> Volume {
    Volume {
        name: RUNNER_TLS_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(crate::tls_secrets::RUNNER_TLS_SECRET.to_owned()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The volume of the runner's certificate.
const RUNNER_TLS_VOLUME: &str = "runner-tls";

/// The emptyDir the init container installs the runner binary into.
const BIN_VOLUME: &str = "agent-bin";
/// The emptyDir holding the runner's socket, bash state and spill files.
const RUN_VOLUME: &str = "agent-run";

/// The workspace: the session's claim, or an emptyDir (sized if asked).
fn workspace_volume(session: &AgentSession, cfg: &PodConfig) -> Volume {
    match session.spec.workspace.as_ref() {
        Some(w) if w.volume_claim_template.is_some() => Volume {
            name: "workspace".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: Names::of(session).claim,
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        },
        w => Volume {
            name: "workspace".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: w
                    .and_then(|w| w.empty_dir.as_ref())
                    .and_then(|e| e.size_limit.clone())
                    .or_else(|| cfg.default_workspace_limit.clone()),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        },
    }
}

/// The init container: the runner image copies its static binary into the
/// emptyDir the sandbox container starts it from.
fn install_container(cfg: &PodConfig) -> Container {
    let install = Install {
        dest: SANDBOX_BIN.to_owned(),
    };
    Container {
        name: INSTALL_CONTAINER.to_owned(),
        image: Some(cfg.runner_image.clone()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(install.command(IMAGE_BIN)),
        volume_mounts: Some(vec![mount(BIN_VOLUME, SANDBOX_BIN_DIR, false)]),
        security_context: Some(hardened(cfg.read_only_root)),
        ..Container::default()
    }
}

/// The runner's `serve` command line in the sandbox container. An idle
/// timeout that is not positive (the CRD's validation refuses those) is
/// left out rather than handed to a runner that would refuse to start.
fn serve(session: &AgentSession, cfg: &PodConfig, warm: bool) -> Serve {
    let spec = &session.spec;
    Serve {
        await_binding: warm.then(|| format!("{TOOLSET_DIR}/{}", runner_api::BINDING_FILE)),
        socket: RUNNER_SOCKET.to_owned(),
        listen: Some(RUNNER_LISTEN),
        workdir: spec.workdir.clone(),
        toolset: Some(format!("{TOOLSET_DIR}/{TOOLSET_FILE}")),
        session: Some(
            session
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .to_owned(),
        ),
        state_dir: Some(state_dir(session)),
        spill_dir: Some(SPILL_DIR.to_owned()),
        // Idle suspension is the runner's idle exit too: the operator tells
        // the two apart by the session's spec when the pod has ended.
        idle_timeout_seconds: spec
            .lifetime
            .as_ref()
            .and_then(|l| l.idle_suspend_seconds.or(l.idle_timeout_seconds))
            .and_then(|s| u64::try_from(s).ok()),
        max_processes: cfg.watch.max_processes,
        end_on_oom: cfg.watch.end_on_oom,
        termination_log: cfg
            .watch
            .any()
            .then(|| runner_api::ended::TERMINATION_LOG.to_owned()),
        gateway: cfg.gateway.then(|| {
            (
                std::net::SocketAddr::from(([0, 0, 0, 0], RUNNER_TLS_PORT)),
                RUNNER_TLS_DIR.to_owned(),
            )
        }),
        restore_from: fork_of(session, warm).map(|_| runner_api::CHECKPOINT_DIR.to_owned()),
    }
}

/// The checkpoint a cold session's pod starts from: the one it names, or
/// the one it took of the session it names (a warm pool's pod never does:
/// a fork starts cold).
fn fork_of(session: &AgentSession, warm: bool) -> Option<String> {
    crate::checkpoint::fork::checkpoint_of(session).filter(|_| !warm)
}

/// The volume of a fork's checkpoint (its claim, read-only).
const CHECKPOINT_VOLUME: &str = "checkpoint";

/// A fork's checkpoint volume and mount: the checkpoint's claim, or, for a
/// fork whose claim was made from the checkpoint's VolumeSnapshot (its
/// status says so, once and for good), the Secret with bash's state.
fn checkpoint_volume(session: &AgentSession, checkpoint: &str) -> (Volume, VolumeMount) {
    match session
        .status
        .as_ref()
        .and_then(|s| s.from_snapshot.as_ref())
    {
        Some(from) => fork_state_volume(&from.state_secret, CHECKPOINT_VOLUME),
        None => fork_volume(checkpoint, CHECKPOINT_VOLUME),
    }
}

/// Where the runner keeps bash's state. On a persistent workspace it lives
/// there (under [`WORKSPACE_STATE_DIR`]), so that a suspended session's
/// next pod resumes with the same cwd, variables and functions; otherwise
/// in the pod's own emptyDir, where it survives a runner restart.
pub fn state_dir(session: &AgentSession) -> String {
    let persistent = session
        .spec
        .workspace
        .as_ref()
        .is_some_and(|w| w.volume_claim_template.is_some());
    if persistent {
        format!(
            "{}/{WORKSPACE_STATE_DIR}",
            session.spec.workdir.trim_end_matches('/')
        )
    } else {
        STATE_DIR.to_owned()
    }
}

/// The runner's state directory inside a persistent workspace.
pub const WORKSPACE_STATE_DIR: &str = ".agentplane/state";

/// The session's image running the runner as its process.
fn sandbox_container(session: &AgentSession, cfg: &PodConfig, warm: bool) -> Container {
    let spec = &session.spec;
    let mut env = vec![EnvVar {
        name: "HOME".to_owned(),
        value: Some(spec.workdir.clone()),
        ..EnvVar::default()
    }];
    env.retain(|e| !spec.env.iter().any(|u| u.name == e.name));
    env.extend(spec.env.iter().cloned());
    let probe = Health {
        socket: RUNNER_SOCKET.to_owned(),
    };
    let mut mounts = vec![
        mount(BIN_VOLUME, SANDBOX_BIN_DIR, true),
        mount(RUN_VOLUME, RUN_DIR, false),
        mount(TOOLSET_VOLUME, TOOLSET_DIR, true),
        mount("workspace", &spec.workdir, false),
        mount("tmp", "/tmp", false),
    ];
    if cfg.gateway {
        mounts.push(mount(RUNNER_TLS_VOLUME, RUNNER_TLS_DIR, true));
    }
    if let Some(checkpoint) = fork_of(session, warm) {
        mounts.push(checkpoint_volume(session, &checkpoint).1);
    }
    Container {
        name: SANDBOX_CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(vec![SANDBOX_BIN.to_owned()]),
        args: Some(serve(session, cfg, warm).args()),
        working_dir: Some(spec.workdir.clone()),
        env: Some(env),
        resources: resources(session, cfg),
        volume_mounts: Some(mounts),
        ports: cfg.gateway.then(|| {
            vec![ContainerPort {
                name: Some("gateway".to_owned()),
                container_port: i32::from(RUNNER_TLS_PORT),
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            }]
        }),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(probe.command(SANDBOX_BIN)),
            }),
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            ..Probe::default()
        }),
        security_context: Some(hardened(cfg.read_only_root)),
        ..Container::default()
    }
}

/// The sandbox container's resources: the session's, with the platform's
/// defaults. Without disk bounds (a pod built before them) the session's
/// resources are taken whole or the defaults whole, as they always were.
/// With them, every resource the session leaves unbounded is bounded: a
/// missing limit is the default limit (never below the session's own
/// request), a missing request the default request (never above the
/// session's limit), and the ephemeral-storage limit, unless the session
/// sets one, covers what the pod's volumes and writable layer may hold
/// (the kubelet compares the pod's whole disk use with it).
fn resources(session: &AgentSession, cfg: &PodConfig) -> Option<ResourceRequirements> {
    let own = session.spec.resources.clone();
    if !cfg.disk.any() {
        return own.or_else(|| cfg.default_resources.clone());
    }
    let own = own.unwrap_or_default();
    let mut requests = own.requests.clone().unwrap_or_default();
    let mut limits = own.limits.clone().unwrap_or_default();
    let defaults = cfg.default_resources.clone().unwrap_or_default();
    for (name, default) in defaults.limits.iter().flatten() {
        if !limits.contains_key(name) {
            let floor = requests.get(name);
            limits.insert(name.clone(), larger(default, floor));
        }
    }
    for (name, default) in defaults.requests.iter().flatten() {
        if !requests.contains_key(name) {
            let ceiling = limits.get(name);
            requests.insert(name.clone(), smaller(default, ceiling));
        }
    }
    const EPHEMERAL: &str = "ephemeral-storage";
    if !limits.contains_key(EPHEMERAL)
        && let Some(total) = disk_total(session, cfg)
    {
        let floor = requests.get(EPHEMERAL).and_then(quantity::of).unwrap_or(0);
        limits.insert(EPHEMERAL.to_owned(), quantity::from_bytes(total.max(floor)));
    }
    if !requests.contains_key(EPHEMERAL)
        && let Some(request) = &cfg.disk.request
    {
        requests.insert(
            EPHEMERAL.to_owned(),
            smaller(request, limits.get(EPHEMERAL)),
        );
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..own
    })
}

fn larger(a: &Quantity, b: Option<&Quantity>) -> Quantity {
    match b {
        Some(b) if quantity::millis(&b.0) > quantity::millis(&a.0) => b.clone(),
        _ => a.clone(),
    }
}

fn smaller(a: &Quantity, b: Option<&Quantity>) -> Quantity {
    match b {
        Some(b) if quantity::millis(&b.0) < quantity::millis(&a.0) => b.clone(),
        _ => a.clone(),
    }
}

fn bin_limit(cfg: &PodConfig) -> Option<Quantity> {
    cfg.disk.any().then(|| Quantity(BIN_VOLUME_SIZE.to_owned()))
}

/// What the pod may write to local disk: its emptyDirs (the workspace
/// when it is one) and the container's writable layer. `None` when one of
/// them is unbounded: a limit on the sum would then silently bound the
/// unbounded part instead.
fn disk_total(session: &AgentSession, cfg: &PodConfig) -> Option<u128> {
    let workspace = match workspace_volume(session, cfg).empty_dir {
        Some(e) => quantity::of(e.size_limit.as_ref()?)?,
        None => 0,
    };
    let bin = bin_limit(cfg);
    let parts = [
        cfg.disk.tmp.as_ref(),
        cfg.disk.runner.as_ref(),
        cfg.disk.layer.as_ref(),
        bin.as_ref(),
    ];
    parts
        .into_iter()
        .try_fold(workspace, |sum, q| sum.checked_add(quantity::of(q?)?))
}

/// The operator-level choices `pod` was built with: its runner image, and
/// the defaults it got where the session set nothing. Rebuilding a session
/// with these tells whether the session itself changed, so that a change of
/// the operator's own settings does not replace every running pod.
///
/// They are read from the pod's [`BUILT_WITH_ANNOTATION`], written when it
/// was built, not from its spec: the API server fills in defaults (an empty
/// `resources: {}`) that were never the operator's choice. A pod from
/// before the annotation existed was built with no defaults and its own
/// runner image.
pub fn config_of(pod: &Pod, cfg: &PodConfig) -> PodConfig {
    let built: Option<BuiltWith> = pod
        .annotations()
        .get(BUILT_WITH_ANNOTATION)
        .and_then(|a| serde_json::from_str(a).ok());
    let built = built.unwrap_or_else(|| BuiltWith {
        runner_image: runner_image(pod).map_or_else(|| cfg.runner_image.clone(), str::to_owned),
        default_resources: None,
        default_workspace_limit: None,
        read_only_root: false,
        disk: DiskBounds::default(),
        host_users: None,
        watch: RunnerWatch::default(),
        gateway: false,
    });
    PodConfig {
        runner_image: built.runner_image,
        image_pull_policy: cfg.image_pull_policy.clone(),
        default_resources: built.default_resources,
        default_workspace_limit: built.default_workspace_limit,
        egress: cfg.egress.clone(),
        read_only_root: built.read_only_root,
        disk: built.disk,
        host_users: built.host_users,
        watch: built.watch,
        gateway: built.gateway,
    }
}

/// The operator-level settings a pod was built with, kept on the pod.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BuiltWith {
    runner_image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_workspace_limit: Option<Quantity>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    read_only_root: bool,
    /// Absent on pods built before disk bounds existed: they were built
    /// without them, and keep being judged so.
    #[serde(default, skip_serializing_if = "is_unbounded")]
    disk: DiskBounds,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host_users: Option<bool>,
    #[serde(default, skip_serializing_if = "is_unwatched")]
    watch: RunnerWatch,
    /// Absent on pods built before the gateway was installed: they keep
    /// their runner on the socket and port-forward only until replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gateway: bool,
}

fn is_unwatched(w: &RunnerWatch) -> bool {
    !w.any()
}

fn is_unbounded(d: &DiskBounds) -> bool {
    !d.any()
}

/// Annotation recording the operator-level settings a pod was built with.
pub const BUILT_WITH_ANNOTATION: &str = "agentplane.dev/built-with";

/// The runner image a sandbox pod was built with (its install container's).
pub fn runner_image(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == INSTALL_CONTAINER)?
        .image
        .as_deref()
}

/// A stable digest of a pod spec.
pub fn spec_hash(spec: &PodSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}
