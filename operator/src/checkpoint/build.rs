//! The objects a checkpoint owns, built without I/O: its claim (the
//! checkpoint's data, deleted with it by the garbage collector) and its
//! short-lived sink pod (the runner image's `checkpoint-sink`, which
//! stores the archive on the claim).

use std::collections::BTreeMap;

use crds::AgentCheckpoint;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, TCPSocketAction,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use runner_api::{
    CHECKPOINT_DIR, CheckpointSink, IMAGE_BIN, Invocation, RUNNER_TLS_DIR, RUNNER_TLS_PORT,
};

use crate::checkpoint::plan::{Settings, Sizes, claim_name, sink_name};

/// Label of a checkpoint's objects: the checkpoint's name (fitted to a
/// label). The controller watches sink pods by it.
pub const CHECKPOINT_LABEL: &str = "agentplane.dev/checkpoint";
/// The sink runs as the sandbox user (the checkpoint's files are read by
/// forks' runners, which run as that user).
const SINK_UID: i64 = 65532;
const DATA_VOLUME: &str = "checkpoint";
const TLS_VOLUME: &str = "runner-tls";

fn labels(checkpoint: &AgentCheckpoint, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "agentplane".to_owned(),
        ),
        (
            "app.kubernetes.io/name".to_owned(),
            format!("agentplane-checkpoint-{component}"),
        ),
        (
            CHECKPOINT_LABEL.to_owned(),
            crate::names::label_value(&checkpoint.name_any()),
        ),
    ])
}

pub(crate) fn owned(checkpoint: &AgentCheckpoint, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: checkpoint.namespace(),
        labels: Some(labels(checkpoint, component)),
        owner_references: checkpoint.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// The checkpoint's claim, of `sizes.volume_bytes`.
pub fn claim(
    checkpoint: &AgentCheckpoint,
    sizes: &Sizes,
    settings: &Settings,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: owned(checkpoint, claim_name(&checkpoint.name_any()), "data"),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: settings.storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(sizes.volume_bytes.to_string()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// The sink pod: hardened as a sandbox is, no service-account token, the
/// claim read-write and the namespace's runner certificate read-only,
/// ready once it listens, ended by its own deadline if nothing comes.
pub fn sink_pod(
    checkpoint: &AgentCheckpoint,
    sizes: &Sizes,
    settings: &Settings,
    runner_image: &str,
    pull_policy: &str,
) -> Pod {
    let name = checkpoint.name_any();
    Pod {
        metadata: owned(checkpoint, sink_name(&name), "sink"),
        spec: Some(PodSpec {
            containers: vec![sink_container(sizes, settings, runner_image, pull_policy)],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            active_deadline_seconds: i64::try_from(settings.sink_deadline_seconds)
                .ok()
                .map(|s| s.saturating_add(60)),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(SINK_UID),
                run_as_group: Some(SINK_UID),
                fs_group: Some(SINK_UID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            volumes: Some(sink_volumes(&name)),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// The name of a checkpoint sink's NetworkPolicy.
pub fn sink_policy_name(checkpoint: &str) -> String {
    crate::names::object_name(checkpoint, "ckpt-sink-egress")
}

/// The sink pod's NetworkPolicy, owned by the checkpoint: no egress at
/// all (the sink stores what it is sent and calls nothing, and the archive
/// it parses came from a sandbox), and ingress only from the operator's
/// pods to the mutual-TLS port its `Import` listens on. With no operator
/// pods to name (an operator run outside the cluster) the ingress side is
/// left to the TLS alone: the egress fence stands either way. `None` when
/// the platform turned policies off.
pub fn sink_policy(
    checkpoint: &AgentCheckpoint,
    policy: &crate::sandbox::EgressPolicy,
) -> Option<NetworkPolicy> {
    if !policy.enabled {
        return None;
    }
    let ingress = policy.operator.as_ref().map(|operator| {
        vec![NetworkPolicyIngressRule {
            from: Some(vec![crate::netpol::peer(operator)]),
            ports: Some(vec![crate::netpol::runner_tls_port()]),
        }]
    });
    let mut types = vec!["Egress".to_owned()];
    if ingress.is_some() {
        types.insert(0, "Ingress".into());
    }
    Some(NetworkPolicy {
        metadata: owned(checkpoint, sink_policy_name(&checkpoint.name_any()), "sink"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(checkpoint, "sink")),
                ..LabelSelector::default()
            }),
            policy_types: Some(types),
            ingress,
            egress: Some(Vec::new()),
        }),
    })
}

/// The sink's container: `checkpoint-sink` from the runner image.
fn sink_container(
    sizes: &Sizes,
    settings: &Settings,
    runner_image: &str,
    pull_policy: &str,
) -> Container {
    let args = CheckpointSink {
        dir: CHECKPOINT_DIR.into(),
        listen_tls: std::net::SocketAddr::from(([0, 0, 0, 0], RUNNER_TLS_PORT)),
        tls_dir: RUNNER_TLS_DIR.into(),
        max_archive_bytes: sizes.archive_bytes,
        deadline_seconds: settings.sink_deadline_seconds,
    };
    let mount = |volume: &str, path: &str, read_only: bool| VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    };
    let quantities = |cpu: &str, memory: &str| {
        Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.into())),
            ("memory".to_owned(), Quantity(memory.into())),
        ]))
    };
    Container {
        name: "sink".into(),
        image: Some(runner_image.into()),
        image_pull_policy: Some(pull_policy.into()),
        command: Some(args.command(IMAGE_BIN)),
        ports: Some(vec![ContainerPort {
            container_port: i32::from(RUNNER_TLS_PORT),
            name: Some("runner-tls".into()),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(RUNNER_TLS_PORT)),
                ..TCPSocketAction::default()
            }),
            period_seconds: Some(1),
            ..Probe::default()
        }),
        resources: Some(ResourceRequirements {
            requests: quantities("50m", "32Mi"),
            limits: quantities("1", "256Mi"),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            run_as_non_root: Some(true),
            run_as_user: Some(SINK_UID),
            run_as_group: Some(SINK_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount(DATA_VOLUME, CHECKPOINT_DIR, false),
            mount(TLS_VOLUME, RUNNER_TLS_DIR, true),
        ]),
        ..Container::default()
    }
}

/// The sink's volumes: the claim, read-write, and the runner certificate.
fn sink_volumes(checkpoint: &str) -> Vec<Volume> {
    vec![
        Volume {
            name: DATA_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(checkpoint),
                read_only: Some(false),
            }),
            ..Volume::default()
        },
        Volume {
            name: TLS_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(crate::tls_secrets::RUNNER_TLS_SECRET.into()),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
    ]
}

/// A fork's view of its checkpoint: the volume (its claim, read-only) and
/// where the sandbox mounts it. Used by the session wing's pod builder.
pub fn fork_volume(checkpoint: &str, volume_name: &str) -> (Volume, VolumeMount) {
    (
        Volume {
            name: volume_name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(checkpoint),
                read_only: Some(true),
            }),
            ..Volume::default()
        },
        checkpoint_mount(volume_name),
    )
}

/// A fork's mount of a VolumeSnapshot checkpoint's Secret (the manifest
/// and bash's state; the files came with the fork's own claim), read-only
/// where the runner's `--restore-from` looks.
pub fn fork_state_volume(secret: &str, volume_name: &str) -> (Volume, VolumeMount) {
    (
        Volume {
            name: volume_name.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        checkpoint_mount(volume_name),
    )
}

/// Where a fork's runner finds its checkpoint, read-only.
fn checkpoint_mount(volume_name: &str) -> VolumeMount {
    VolumeMount {
        name: volume_name.into(),
        mount_path: CHECKPOINT_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}
