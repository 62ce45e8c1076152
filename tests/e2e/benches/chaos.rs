//! Chaos on the real cluster (not a test: prints figures, aborts with the
//! evidence when a promise is broken). Two operator replicas elect a leader
//! by Lease while `CHAOS_SESSIONS` sessions (default 500) are created and
//! deleted in batches; a killer sends SIGKILL to a random replica
//! `CHAOS_KILLS` times (default 20) at random 1-6 s intervals and starts it
//! again. `CHAOS_SURVIVORS` sessions (default 20) are kept and run real
//! pods; the churned ones carry a node selector no node has, so the one
//! 2-core node is not asked to start hundreds of containers while the
//! operator still creates, owns and loses their pods. At the end: every
//! survivor Ready, exactly one pod per survivor, and after the garbage
//! collector settles no pod, ConfigMap or NetworkPolicy of a deleted
//! session. Halfway through the churn the API server itself is killed with
//! SIGKILL and started again (`tests/cluster/cluster.sh restart-apiserver`);
//! the operator must recover by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, env_or, free_port, install_crd, runner_image,
    sandbox_image, wait_for,
};
use serde_json::Value;

/// xorshift64*, seeded from the clock.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn session(name: &str, survivor: bool) -> String {
    let placement = if survivor {
        ""
    } else {
        "  nodeSelector: {agentplane.dev/chaos: nowhere}\n"
    };
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n{placement}  tools: [{{type: agent_toolset_20260401}}]\n---\n",
        sandbox_image()
    )
}

fn names(k: &Kubectl, kind: &str, ns: &str) -> Vec<Value> {
    k.get(&[
        kind,
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/managed-by=agentplane",
    ])
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default()
}

fn owner_uid(o: &Value) -> String {
    o.pointer("/metadata/ownerReferences/0/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn main() {
    let total = env_or::<u64>("CHAOS_SESSIONS", 500);
    let kills = env_or::<u64>("CHAOS_KILLS", 20);
    let survivors = env_or::<u64>("CHAOS_SURVIVORS", 20).max(1);
    let every = (total / survivors).max(1);
    let k = Kubectl::from_env();
    install_crd(&k);
    let ns = Namespace::create(&k, "chaos", &[]);
    let logs = tempfile::tempdir().expect("tempdir");
    let certs = Arc::new(Certs::generate());
    let runner = runner_image();
    let lease = format!("agentplane-chaos-{}", std::process::id());
    let start_replica = {
        let (k, certs, runner, lease) = (k.clone(), certs.clone(), runner.clone(), lease.clone());
        let dir = logs.path().to_owned();
        move |i: usize| {
            Operator::start(
                &k.kubeconfig,
                &certs,
                free_port(),
                &dir.join(format!("operator-{i}.log")),
                &[
                    "--runner-image",
                    &runner,
                    "--leader-elect",
                    "--lease-namespace",
                    "default",
                    "--lease-name",
                    &lease,
                    "--allow-node-selector",
                    "agentplane.dev/chaos=nowhere",
                ],
            )
        }
    };
    let replicas: Arc<Mutex<Vec<Option<Operator>>>> = Arc::new(Mutex::new(vec![
        Some(start_replica(0)),
        Some(start_replica(1)),
    ]));
    let done = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicU64::new(0));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64)
        | 1;
    let killer = {
        let (replicas, done, killed) = (replicas.clone(), done.clone(), killed.clone());
        let start_replica = start_replica.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(seed);
            while killed.load(Ordering::SeqCst) < kills && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1_000 + rng.below(5_000)));
                let i = rng.below(2) as usize;
                let old = replicas.lock().expect("replicas")[i].take();
                if let Some(op) = old {
                    op.kill(); // SIGKILL
                }
                killed.fetch_add(1, Ordering::SeqCst);
                let fresh = start_replica(i);
                replicas.lock().expect("replicas")[i] = Some(fresh);
            }
        })
    };

    // The churn: batches of 25 created; the batch before the previous one
    // deleted, its survivors kept.
    let started = Instant::now();
    let batch = 25u64;
    let mut kept = BTreeSet::new();
    let mut live: Vec<String> = Vec::new();
    let mut deleted = 0u64;
    let mut i = 0u64;
    let mut apiserver_restarts = 0u64;
    while i < total {
        let mut yaml = String::new();
        let mut this = Vec::new();
        for j in i..(i + batch).min(total) {
            let name = format!("s-{j:04}");
            let survivor = j % every == 0 && (kept.len() as u64) < survivors;
            if survivor {
                kept.insert(name.clone());
            }
            yaml.push_str(&session(&name, survivor));
            this.push(name);
        }
        if i == (total / batch / 2) * batch {
            let out = std::process::Command::new(e2e::root().join("tests/cluster/cluster.sh"))
                .arg("restart-apiserver")
                .output()
                .expect("cluster.sh runs");
            assert!(
                out.status.success(),
                "restart-apiserver: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            apiserver_restarts += 1;
        }
        // The API server may be coming back: retry, bounded.
        wait_for("the batch to apply", Duration::from_secs(120), || {
            k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&yaml))
                .ok
                .then_some(())
        });
        let doomed: Vec<String> = live.drain(..).filter(|n| !kept.contains(n)).collect();
        if !doomed.is_empty() {
            let mut args = vec![
                "delete",
                "agentsession",
                "-n",
                &ns.name,
                "--wait=false",
                "--ignore-not-found",
            ];
            args.extend(doomed.iter().map(String::as_str));
            wait_for("the batch to delete", Duration::from_secs(120), || {
                k.run(&args, None).ok.then_some(())
            });
            deleted += doomed.len() as u64;
        }
        live = this;
        i += batch;
        std::thread::sleep(Duration::from_millis(500));
    }
    let doomed: Vec<String> = live.drain(..).filter(|n| !kept.contains(n)).collect();
    if !doomed.is_empty() {
        let mut args = vec!["delete", "agentsession", "-n", &ns.name, "--wait=false"];
        args.extend(doomed.iter().map(String::as_str));
        k.must(&args);
        deleted += doomed.len() as u64;
    }
    let churned = started.elapsed();
    // Let the killer finish its count, then stop it.
    while killed.load(Ordering::SeqCst) < kills && started.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(500));
    }
    done.store(true, Ordering::SeqCst);
    let _ = killer.join();

    // Every survivor Ready.
    let settle = Instant::now();
    wait_for("every survivor Ready", Duration::from_secs(600), || {
        let list = k.get(&["agentsessions", "-n", &ns.name])?;
        let ready = list["items"]
            .as_array()?
            .iter()
            .filter(|s| s["status"]["phase"] == "Ready")
            .count();
        (ready == kept.len()).then_some(())
    });
    let to_ready = settle.elapsed();
    // The garbage collector removes what the deleted sessions owned.
    let sessions = e2e::sessions_by_uid(&k, &ns.name);
    assert_eq!(sessions.len(), kept.len(), "sessions left: {sessions:?}");
    let orphans = |kind: &str| -> Vec<String> {
        names(&k, kind, &ns.name)
            .iter()
            .filter(|o| !sessions.contains_key(&owner_uid(o)))
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let gc = wait_for(
        "the garbage collector to settle",
        Duration::from_secs(300),
        || {
            let left: Vec<String> = ["pods", "configmaps", "networkpolicies"]
                .iter()
                .flat_map(|kind| orphans(kind))
                .collect();
            left.is_empty().then_some(settle.elapsed())
        },
    );
    let pods = names(&k, "pods", &ns.name);
    let mut per_session: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pods {
        *per_session.entry(owner_uid(p)).or_default() += 1;
    }
    let duplicates: Vec<_> = per_session.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "sessions with more than one pod: {duplicates:?}"
    );
    assert_eq!(pods.len(), kept.len(), "one pod per survivor");
    for kind in ["configmaps", "networkpolicies"] {
        assert_eq!(
            names(&k, kind, &ns.name).len(),
            kept.len(),
            "{kind}: one per survivor"
        );
    }
    println!(
        "chaos: {total} sessions created and {deleted} deleted in {:.0} s while {} operator replicas were killed with SIGKILL (2 replicas, Lease election) and the API server was killed and restarted {apiserver_restarts} time(s); {} survivors Ready {:.0} s after the churn; duplicate pods 0; orphan pods/ConfigMaps/NetworkPolicies 0 after {:.0} s",
        churned.as_secs_f64(),
        killed.load(Ordering::SeqCst),
        kept.len(),
        to_ready.as_secs_f64(),
        gc.as_secs_f64()
    );
    let _ = k.run(
        &[
            "delete",
            "lease",
            &lease,
            "-n",
            "default",
            "--ignore-not-found",
        ],
        None,
    );
    drop(replicas);
}
