//! The platform's session policy: which pod-level fields a session's author
//! may set, and to what.
//!
//! The operator creates pods with more privilege than the users who create
//! sessions, so a field passed through unchecked is a way around the
//! cluster's own RBAC: an env `secretKeyRef` would put a Secret the author
//! cannot read into a shell the author drives. Every such field is denied
//! unless the platform (chart values -> operator flags) allows it. The
//! webhook denies with the field's path; the controller checks again and
//! runs no pod for a spec that fails, because the webhook may not have run.

use std::collections::BTreeSet;

use crds::AgentSessionSpec;

use crate::validation::Finding;

/// What the platform allows sessions to ask for. The default allows none
/// of the guarded fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Secrets (by name, in the session's namespace) env may reference.
    pub secret_refs: BTreeSet<String>,
    /// ConfigMaps (by name, in the session's namespace) env may reference.
    pub configmap_refs: BTreeSet<String>,
    /// RuntimeClasses a session may select.
    pub runtime_classes: BTreeSet<String>,
    /// `key=value` node-selector terms a session may use.
    pub node_selectors: BTreeSet<String>,
    /// Whether a session may set tolerations.
    pub tolerations: bool,
    /// StorageClasses a workspace claim may name (unset always allowed: the
    /// cluster's default class).
    pub storage_classes: BTreeSet<String>,
    /// The most local disk a session may ask for: its ephemeral-storage
    /// request and limit, and an emptyDir workspace's size limit. `None`
    /// caps nothing.
    pub max_ephemeral_storage: Option<String>,
}

/// The `sessionPolicy` section of the chart's values, as the chart's
/// schema defines it (an unknown key is an error, as `helm install` makes
/// it): `agent-operator check --values` reads the same file the platform
/// installs the chart with, so the offline verdict is the webhook's.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ChartPolicy {
    #[serde(default)]
    secret_refs: Vec<String>,
    #[serde(default)]
    config_map_refs: Vec<String>,
    #[serde(default)]
    runtime_classes: Vec<String>,
    #[serde(default)]
    node_selectors: Vec<String>,
    #[serde(default)]
    allow_tolerations: bool,
    #[serde(default)]
    storage_classes: Vec<String>,
    #[serde(default)]
    max_ephemeral_storage: Option<String>,
}

impl SessionPolicy {
    /// The policy a chart values file (YAML) installs: its `sessionPolicy`
    /// section, or the default (deny every guarded field) when it has none.
    pub fn from_chart_values(text: &str) -> Result<Self, String> {
        let values: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
        let section = match values.get("sessionPolicy") {
            None | Some(serde_yaml::Value::Null) => return Ok(Self::default()),
            Some(v) => v.clone(),
        };
        let chart: ChartPolicy = serde_path_to_error::deserialize(section)
            .map_err(|e| format!("sessionPolicy.{}: {}", e.path(), e.inner()))?;
        if let Some(max) = &chart.max_ephemeral_storage
            && !max.is_empty()
            && crate::quantity::bytes(max).is_none()
        {
            return Err(format!(
                "sessionPolicy.maxEphemeralStorage: {max:?} is not a byte quantity (e.g. 20Gi)"
            ));
        }
        Ok(Self {
            secret_refs: chart.secret_refs.into_iter().collect(),
            configmap_refs: chart.config_map_refs.into_iter().collect(),
            runtime_classes: chart.runtime_classes.into_iter().collect(),
            node_selectors: chart.node_selectors.into_iter().collect(),
            tolerations: chart.allow_tolerations,
            storage_classes: chart.storage_classes.into_iter().collect(),
            max_ephemeral_storage: chart.max_ephemeral_storage.filter(|m| !m.is_empty()),
        })
    }
}

fn deny(path: String, message: String) -> Finding {
    Finding { path, message }
}

/// Every field of `spec` the policy does not allow.
pub fn check(spec: &AgentSessionSpec, policy: &SessionPolicy) -> Vec<Finding> {
    let mut out = Vec::new();
    check_env(spec, policy, &mut out);
    check_placement(spec, policy, &mut out);
    check_workspace(spec, policy, &mut out);
    check_disk(spec, policy, &mut out);
    out
}

/// A session's ephemeral-storage request and limit, and its emptyDir
/// workspace's size, within the platform's cap.
fn check_disk(spec: &AgentSessionSpec, policy: &SessionPolicy, out: &mut Vec<Finding>) {
    let Some(max) = policy.max_ephemeral_storage.as_deref() else {
        return;
    };
    let Some(cap) = crate::quantity::bytes(max) else {
        return;
    };
    let mut asked: Vec<(String, &str)> = Vec::new();
    if let Some(r) = &spec.resources {
        for (kind, map) in [("requests", &r.requests), ("limits", &r.limits)] {
            if let Some(q) = map.as_ref().and_then(|m| m.get("ephemeral-storage")) {
                asked.push((format!("spec.resources.{kind}.ephemeral-storage"), &q.0));
            }
        }
    }
    if let Some(q) = spec
        .workspace
        .as_ref()
        .and_then(|w| w.empty_dir.as_ref())
        .and_then(|e| e.size_limit.as_ref())
    {
        asked.push(("spec.workspace.emptyDir.sizeLimit".into(), &q.0));
    }
    for (path, q) in asked {
        match crate::quantity::bytes(q) {
            Some(n) if n <= cap => {}
            Some(_) => out.push(deny(
                path,
                format!(
                    "{q} is more local disk than the platform allows a session ({max}, sessionPolicy.maxEphemeralStorage)"
                ),
            )),
            None => out.push(deny(
                path,
                format!("{q:?} is not a byte quantity (e.g. 2Gi)"),
            )),
        }
    }
}

fn check_env(spec: &AgentSessionSpec, policy: &SessionPolicy, out: &mut Vec<Finding>) {
    for (i, var) in spec.env.iter().enumerate() {
        let Some(from) = var.value_from.as_ref() else {
            continue;
        };
        let at = format!("spec.env[{i}].valueFrom");
        if let Some(r) = &from.secret_key_ref
            && !policy.secret_refs.contains(&r.name)
        {
            out.push(deny(
                format!("{at}.secretKeyRef.name"),
                format!(
                    "Secret {:?} is not one the platform lets sessions read (sessionPolicy.secretRefs); set the value literally or ask the platform team",
                    r.name
                ),
            ));
        }
        if let Some(r) = &from.config_map_key_ref
            && !policy.configmap_refs.contains(&r.name)
        {
            out.push(deny(
                format!("{at}.configMapKeyRef.name"),
                format!(
                    "ConfigMap {:?} is not one the platform lets sessions read (sessionPolicy.configMapRefs)",
                    r.name
                ),
            ));
        }
        // fieldRef and resourceFieldRef read the sandbox pod's own metadata
        // and limits: nothing the session could not see from inside.
    }
}

fn check_placement(spec: &AgentSessionSpec, policy: &SessionPolicy, out: &mut Vec<Finding>) {
    if let Some(rc) = &spec.runtime_class_name
        && !policy.runtime_classes.contains(rc)
    {
        out.push(deny(
            "spec.runtimeClassName".into(),
            format!("RuntimeClass {rc:?} is not allowed (sessionPolicy.runtimeClasses)"),
        ));
    }
    for (k, v) in &spec.node_selector {
        let term = format!("{k}={v}");
        if !policy.node_selectors.contains(&term) {
            out.push(deny(
                format!("spec.nodeSelector[{k:?}]"),
                format!("{term:?} is not an allowed node selector (sessionPolicy.nodeSelectors)"),
            ));
        }
    }
    if !spec.tolerations.is_empty() && !policy.tolerations {
        out.push(deny(
            "spec.tolerations".into(),
            "sessions may not set tolerations (sessionPolicy.allowTolerations)".into(),
        ));
    }
}

fn check_workspace(spec: &AgentSessionSpec, policy: &SessionPolicy, out: &mut Vec<Finding>) {
    let Some(claim) = spec
        .workspace
        .as_ref()
        .and_then(|w| w.volume_claim_template.as_ref())
    else {
        return;
    };
    let at = "spec.workspace.volumeClaimTemplate.spec";
    let s = &claim.spec;
    if s.data_source.is_some() || s.data_source_ref.is_some() {
        out.push(deny(
            format!("{at}.dataSource"),
            "a workspace cannot be cloned from another claim or snapshot: it could hold another tenant's data".into(),
        ));
    }
    if s.volume_name.is_some() {
        out.push(deny(
            format!("{at}.volumeName"),
            "a workspace cannot bind a named PersistentVolume: it could hold another tenant's data"
                .into(),
        ));
    }
    if s.selector.is_some() {
        out.push(deny(
            format!("{at}.selector"),
            "a workspace cannot select existing PersistentVolumes by label: one could hold another tenant's data"
                .into(),
        ));
    }
    if let Some(class) = &s.storage_class_name
        && !policy.storage_classes.contains(class)
    {
        out.push(deny(
            format!("{at}.storageClassName"),
            format!(
                "StorageClass {class:?} is not allowed (sessionPolicy.storageClasses); leave it unset for the cluster's default"
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> AgentSessionSpec {
        let mut base = json!({"image": "busybox", "tools": []});
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        serde_json::from_value(base).expect("spec")
    }

    fn paths(spec: &AgentSessionSpec, policy: &SessionPolicy) -> Vec<String> {
        check(spec, policy).into_iter().map(|f| f.path).collect()
    }

    #[test]
    fn by_default_no_guarded_field_is_allowed() {
        let s = spec(json!({
            "env": [
                {"name": "LITERAL", "value": "ok"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}
            ],
            "runtimeClassName": "gvisor",
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "workspace": {"volumeClaimTemplate": {"spec": {
                "storageClassName": "fast",
                "volumeName": "pv-of-someone-else",
                "selector": {"matchLabels": {"tenant": "b"}},
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"},
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}
        }));
        assert_eq!(
            paths(&s, &SessionPolicy::default()),
            [
                "spec.env[2].valueFrom.secretKeyRef.name",
                "spec.env[3].valueFrom.configMapKeyRef.name",
                "spec.runtimeClassName",
                "spec.nodeSelector[\"pool\"]",
                "spec.tolerations",
                "spec.workspace.volumeClaimTemplate.spec.dataSource",
                "spec.workspace.volumeClaimTemplate.spec.volumeName",
                "spec.workspace.volumeClaimTemplate.spec.selector",
                "spec.workspace.volumeClaimTemplate.spec.storageClassName",
            ]
        );
    }

    #[test]
    fn what_the_platform_lists_is_allowed() {
        let s = spec(json!({
            "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
            "runtimeClassName": "gvisor",
            "nodeSelector": {"pool": "sandbox"},
            "tolerations": [{"key": "sandbox", "operator": "Exists"}],
            "workspace": {"volumeClaimTemplate": {"spec": {"storageClassName": "fast"}}}
        }));
        let policy = SessionPolicy {
            secret_refs: ["db".to_owned()].into(),
            runtime_classes: ["gvisor".to_owned()].into(),
            node_selectors: ["pool=sandbox".to_owned()].into(),
            tolerations: true,
            storage_classes: ["fast".to_owned()].into(),
            ..SessionPolicy::default()
        };
        assert!(paths(&s, &policy).is_empty());
        // Another Secret is still denied; the message names the rule.
        let other = spec(json!({
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "root-ca", "key": "k"}}}]
        }));
        let f = check(&other, &policy);
        assert_eq!(f.len(), 1);
        assert!(
            f[0].message.contains("sessionPolicy.secretRefs"),
            "{}",
            f[0].message
        );
    }
}
