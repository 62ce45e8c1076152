//! Pieces of the scale benchmark (`benches/scale.rs`) that are not phases:
//! what sessions look like on fake nodes, when each was created and turned
//! Ready (a watch, not polling), process figures from /proc, the
//! operator's own identity (a ServiceAccount, so that the API server's
//! flow-control metrics count its requests apart), and the audit that lists
//! every object to find lost or duplicate ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Kubectl;
use crate::api::{ApiServer, metric_sum};

/// The label every fake node carries (tests/cluster/kwok.sh).
pub const FAKE_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// The taint every fake node carries.
pub const FAKE_NODE_TAINT: &str = "agentplane.dev/simulated";
/// Where the operator's identity, Lease and FlowSchemas live.
pub const SCALE_NS: &str = "agentplane-scale";
/// The operator's ServiceAccount.
pub const OPERATOR_SA: &str = "agentplane-scale-operator";
/// The FlowSchemas that count the operator's requests, by what they are on.
pub const FLOW_SCHEMAS: [(&str, &str); 4] = [
    ("pods", "agentplane-scale-pods"),
    ("configmaps", "agentplane-scale-configmaps"),
    ("agentsessions", "agentplane-scale-sessions"),
    ("other", "agentplane-scale-other"),
];

const SESSIONS: &str = "/apis/agentplane.dev/v1alpha1";

/// The path of the sessions collection in `ns`.
pub fn sessions_path(ns: &str) -> String {
    format!("{SESSIONS}/namespaces/{ns}/agentsessions")
}

/// Scheduling that puts a sandbox on a fake node, and only there.
fn on_fake_nodes() -> (Value, Value) {
    (
        json!({ FAKE_NODE_LABEL.0: FAKE_NODE_LABEL.1 }),
        json!([{ "key": FAKE_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule" }]),
    )
}

/// A session whose sandbox lands on a fake node; `pool` names a warm pool.
pub fn session(ns: &str, name: &str, image: &str, pool: Option<&str>) -> Value {
    let (selector, tolerations) = on_fake_nodes();
    let mut s = json!({
        "apiVersion": "agentplane.dev/v1alpha1",
        "kind": "AgentSession",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "image": image,
            "tools": [{ "type": "agent_toolset_20260401" }],
            "nodeSelector": selector,
            "tolerations": tolerations,
            "resources": { "requests": { "cpu": "1m", "memory": "16Mi" } }
        }
    });
    if let Some(p) = pool {
        s["spec"]["warmPool"] = json!(p);
    }
    s
}

/// Where a suspendable session's claim is bound: a class no provisioner
/// serves, so its claim binds only to the volume made for it
/// ([`static_volume`]).
pub const STATIC_CLASS: &str = "agentplane-scale-static";

/// A session on a fake node whose workspace is a claim (the operator names
/// it `<name>-workspace`), so that it may be suspended: the webhook refuses
/// to suspend an emptyDir session, whose files would be lost.
pub fn suspendable_session(ns: &str, name: &str, image: &str) -> Value {
    let mut s = session(ns, name, image, None);
    s["spec"]["workspace"] = json!({
        "volumeClaimTemplate": { "spec": {
            "storageClassName": STATIC_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": "1Mi" } }
        }}
    });
    s
}

/// A volume bound in advance to the claim of [`suspendable_session`]
/// `ns/name`. Fake nodes mount nothing, so its hostPath is never used; it
/// lets the scheduler place the pod as it would with a real volume (no node
/// affinity), which a provisioner cannot do on nodes whose pods only seem to
/// run.
pub fn static_volume(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("{ns}-{name}"),
            "labels": { "agentplane.dev/scale": "true" }
        },
        "spec": {
            "storageClassName": STATIC_CLASS,
            "capacity": { "storage": "1Mi" },
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": { "path": "/nonexistent/agentplane-scale" },
            "claimRef": { "namespace": ns, "name": format!("{name}-workspace") }
        }
    })
}

/// A warm pool of `replicas` sandboxes on fake nodes.
pub fn warm_pool(ns: &str, name: &str, image: &str, replicas: usize) -> Value {
    let (selector, tolerations) = on_fake_nodes();
    json!({
        "apiVersion": "agentplane.dev/v1alpha1",
        "kind": "AgentWarmPool",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "replicas": replicas,
            "template": {
                "image": image,
                "nodeSelector": selector,
                "tolerations": tolerations,
                "resources": { "requests": { "cpu": "1m", "memory": "16Mi" } }
            }
        }
    })
}

/// When each session (`namespace/name`) was created and first seen in a
/// phase.
#[derive(Debug, Default)]
pub struct Tracker {
    pub created: Mutex<HashMap<String, Instant>>,
    /// When the operator's first status (any phase) was seen: the
    /// session has been reconciled once.
    pub statused: Mutex<HashMap<String, Instant>>,
    pub ready: Mutex<HashMap<String, Instant>>,
    pub suspended: Mutex<HashMap<String, Instant>>,
}

fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["metadata"]["namespace"].as_str().unwrap_or_default(),
        obj["metadata"]["name"].as_str().unwrap_or_default()
    )
}

impl Tracker {
    pub fn mark_created(&self, key: String, at: Instant) {
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, at);
    }

    fn see(&self, obj: &Value, at: Instant) {
        if obj["status"]["phase"].is_string() {
            self.statused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key_of(obj))
                .or_insert(at);
        }
        let map = match obj["status"]["phase"].as_str() {
            Some("Ready") => &self.ready,
            Some("Suspended") => &self.suspended,
            _ => return,
        };
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key_of(obj))
            .or_insert(at);
    }

    /// Of `keys`: how many turned Ready, per second from the first
    /// creation to the last Ready, and the sorted creation-to-Ready times.
    pub fn ready_figures(&self, keys: &[String]) -> (usize, f64, Vec<Duration>) {
        self.figures(keys, &self.ready)
    }

    /// As [`Tracker::ready_figures`], from `since` (per key) to Suspended.
    pub fn suspended_figures(&self, since: &HashMap<String, Instant>) -> Vec<Duration> {
        let s = self.suspended.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Duration> = since
            .iter()
            .filter_map(|(k, t0)| Some(s.get(k)?.saturating_duration_since(*t0)))
            .collect();
        out.sort();
        out
    }

    fn figures(
        &self,
        keys: &[String],
        done: &Mutex<HashMap<String, Instant>>,
    ) -> (usize, f64, Vec<Duration>) {
        let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        let done = done.lock().unwrap_or_else(|e| e.into_inner());
        let mut lat = Vec::new();
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for k in keys {
            let Some(c) = created.get(k) else { continue };
            first = Some(first.map_or(*c, |f| f.min(*c)));
            if let Some(d) = done.get(k) {
                lat.push(d.saturating_duration_since(*c));
                last = Some(last.map_or(*d, |l| l.max(*d)));
            }
        }
        lat.sort();
        let rate = match (first, last) {
            (Some(f), Some(l)) if l > f => lat.len() as f64 / (l - f).as_secs_f64(),
            _ => 0.0,
        };
        (lat.len(), rate, lat)
    }

    pub fn count_ready(&self, keys: &[String]) -> usize {
        let r = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter().filter(|k| r.contains_key(*k)).count()
    }
}

/// Follows every AgentSession in the cluster into `tracker` until `stop`:
/// a list, then a watch from its resourceVersion, reopened when the API
/// server ends it and relisted when that version is too old.
pub fn follow_sessions(api: ApiServer, tracker: Arc<Tracker>, stop: Arc<AtomicBool>) {
    let mut rv = String::new();
    while !stop.load(Ordering::Relaxed) {
        if rv.is_empty() {
            match list_with_version(&api, &format!("{SESSIONS}/agentsessions")) {
                Ok((items, v)) => {
                    let now = Instant::now();
                    for i in &items {
                        tracker.see(i, now);
                    }
                    rv = v;
                }
                Err(e) => {
                    eprintln!("scale: listing sessions: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let path = format!(
            "{SESSIONS}/agentsessions?watch=1&allowWatchBookmarks=true&timeoutSeconds=120&resourceVersion={rv}"
        );
        let result = api.watch(&path, |ev| {
            let obj = &ev["object"];
            match ev["type"].as_str() {
                Some("ERROR") => {
                    rv.clear();
                    return false;
                }
                Some("BOOKMARK") => {}
                _ => tracker.see(obj, Instant::now()),
            }
            if let Some(v) = obj["metadata"]["resourceVersion"].as_str() {
                rv = v.to_owned();
            }
            !stop.load(Ordering::Relaxed)
        });
        if let Err(e) = result {
            eprintln!("scale: session watch: {e}; relisting");
            rv.clear();
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Every item under `path` with the list's resourceVersion.
pub fn list_with_version(api: &ApiServer, path: &str) -> Result<(Vec<Value>, String), String> {
    let mut items = Vec::new();
    let mut cont = String::new();
    let mut version = String::new();
    loop {
        let r = api.get(&format!("{path}?limit=1000&continue={cont}"));
        let v = r
            .json()
            .filter(|_| r.ok())
            .ok_or_else(|| format!("list {path}: {} {}", r.status, r.body))?;
        if version.is_empty() {
            version = v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        items.extend(v["items"].as_array().cloned().unwrap_or_default());
        match v["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_owned(),
            _ => return Ok((items, version)),
        }
    }
}

/// Resident memory (KiB) and CPU time used so far of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub rss_kib: u64,
    pub cpu: Duration,
    pub at: Option<Instant>,
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A process's figures now, or `None` when it is gone.
pub fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ProcSample {
        rss_kib,
        cpu: Duration::from_secs_f64(ticks / clock_ticks()),
        at: Some(Instant::now()),
    })
}

/// CPU used between two samples as a share of one core.
pub fn cpu_share(a: &ProcSample, b: &ProcSample) -> f64 {
    match (a.at, b.at) {
        (Some(x), Some(y)) if y > x => {
            b.cpu.saturating_sub(a.cpu).as_secs_f64() / (y - x).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// The harness's control-plane processes by name (their pid files), for
/// the table of what grows with the number of sessions.
pub fn cluster_pids() -> BTreeMap<&'static str, u32> {
    let dir = std::env::var("AGENTPLANE_CLUSTER_RUN")
        .unwrap_or_else(|_| "/run/agentplane-cluster".into());
    [
        "kube-apiserver",
        "etcd",
        "kwok",
        "kube-scheduler",
        "kube-controller-manager",
        "kube-router",
    ]
    .into_iter()
    .filter_map(|n| {
        let text = std::fs::read_to_string(format!("{dir}/pids/{n}.pid")).ok()?;
        Some((n, text.split_whitespace().next()?.parse().ok()?))
    })
    .collect()
}

/// Makes the operator's identity: a ServiceAccount bound to cluster-admin
/// and FlowSchemas that sort its requests by resource (priority level
/// workload-low, as an in-cluster controller's ServiceAccount gets by
/// default). Returns a kubeconfig for it, written into `dir`.
pub fn operator_identity(k: &Kubectl, admin_kubeconfig: &str, dir: &std::path::Path) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {SCALE_NS}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {OPERATOR_SA}, namespace: {SCALE_NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {OPERATOR_SA}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects: [{{kind: ServiceAccount, name: {OPERATOR_SA}, namespace: {SCALE_NS}}}]\n"
    );
    for (i, (what, name)) in FLOW_SCHEMAS.iter().enumerate() {
        let rule = match *what {
            "other" => "resourceRules: [{verbs: ['*'], apiGroups: ['*'], resources: ['*'], clusterScope: true, namespaces: ['*']}]\n    nonResourceRules: [{verbs: ['*'], nonResourceURLs: ['*']}]".to_owned(),
            "agentsessions" => "resourceRules: [{verbs: ['*'], apiGroups: [agentplane.dev], resources: ['*'], clusterScope: true, namespaces: ['*']}]".to_owned(),
            r => format!("resourceRules: [{{verbs: ['*'], apiGroups: [''], resources: [{r}], clusterScope: true, namespaces: ['*']}}]"),
        };
        yaml.push_str(&format!(
            "---\napiVersion: flowcontrol.apiserver.k8s.io/v1\nkind: FlowSchema\nmetadata: {{name: {name}}}\nspec:\n  matchingPrecedence: {}\n  priorityLevelConfiguration: {{name: workload-low}}\n  distinguisherMethod: {{type: ByUser}}\n  rules:\n  - subjects: [{{kind: ServiceAccount, serviceAccount: {{name: {OPERATOR_SA}, namespace: {SCALE_NS}}}}}]\n    {rule}\n",
            500 + i
        ));
    }
    let r = k.apply(&yaml);
    assert!(r.ok, "operator identity: {}", r.stderr);
    let token = k.must(&[
        "create",
        "token",
        OPERATOR_SA,
        "-n",
        SCALE_NS,
        "--duration=12h",
    ]);
    let admin = std::fs::read_to_string(admin_kubeconfig).expect("admin kubeconfig");
    let line = |key: &str| {
        admin
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim_start_matches(':').trim().to_owned())
            .unwrap_or_else(|| panic!("the admin kubeconfig has no {key}"))
    };
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: op\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: op}}\ncurrent-context: c\n",
        line("server"),
        line("certificate-authority-data"),
        token.trim()
    );
    let path = dir.join("operator.kubeconfig");
    std::fs::write(&path, kubeconfig).expect("write the operator's kubeconfig");
    path.to_string_lossy().into_owned()
}

/// The operator's requests so far, by FlowSchema (what they were on).
pub fn operator_requests(metrics: &str) -> BTreeMap<&'static str, f64> {
    FLOW_SCHEMAS
        .iter()
        .map(|(what, fs)| {
            (
                *what,
                metric_sum(
                    metrics,
                    "apiserver_flowcontrol_dispatched_requests_total",
                    &[("flow_schema", fs)],
                ),
            )
        })
        .collect()
}

/// What listing every object found.
#[derive(Debug, Default)]
pub struct Audit {
    pub sessions: usize,
    pub ready: usize,
    pub suspended: usize,
    /// Sessions neither suspended nor Ready, or with no pod while not suspended.
    pub lost: Vec<String>,
    /// Sessions with more than one pod or ConfigMap.
    pub duplicate: Vec<String>,
    /// Pods or ConfigMaps naming a session that does not exist.
    pub orphans: usize,
    pub pods: usize,
    pub configmaps: usize,
}

/// Lists every session, pod and ConfigMap in namespaces starting with
/// `prefix` and matches them by owner UID.
pub fn audit(api: &ApiServer, prefix: &str) -> Result<Audit, String> {
    let in_scope = |o: &Value| {
        o["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| n.starts_with(prefix))
    };
    let sessions: Vec<Value> = api
        .list_all(&format!("{SESSIONS}/agentsessions"), 1000)?
        .into_iter()
        .filter(in_scope)
        .collect();
    let owned = |path: &str| -> Result<HashMap<String, usize>, String> {
        let mut by_owner = HashMap::new();
        for o in api.list_all(path, 1000)?.iter().filter(|o| in_scope(o)) {
            for r in o["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if r["kind"] == "AgentSession"
                    && let Some(uid) = r["uid"].as_str()
                {
                    *by_owner.entry(uid.to_owned()).or_insert(0) += 1;
                }
            }
        }
        Ok(by_owner)
    };
    let pods = owned("/api/v1/pods?labelSelector=agentplane.dev%2Fsession")?;
    let cms = owned("/api/v1/configmaps")?;
    let mut a = Audit {
        sessions: sessions.len(),
        pods: pods.values().sum(),
        configmaps: cms.values().sum(),
        ..Audit::default()
    };
    let mut uids = std::collections::HashSet::new();
    for s in &sessions {
        let uid = s["metadata"]["uid"].as_str().unwrap_or_default();
        uids.insert(uid.to_owned());
        let key = key_of(s);
        let suspended = s["spec"]["suspended"] == json!(true);
        match s["status"]["phase"].as_str() {
            Some("Ready") => a.ready += 1,
            Some("Suspended") => a.suspended += 1,
            _ => a
                .lost
                .push(format!("{key} (phase {})", s["status"]["phase"])),
        }
        let n_pods = pods.get(uid).copied().unwrap_or(0);
        if !suspended && n_pods == 0 {
            a.lost.push(format!("{key} (no pod)"));
        }
        if n_pods > 1 || cms.get(uid).copied().unwrap_or(0) > 1 {
            a.duplicate.push(key);
        }
    }
    a.orphans = pods
        .keys()
        .chain(cms.keys())
        .filter(|u| !uids.contains(*u))
        .count();
    Ok(a)
}
