//! Ten thousand sessions: the control plane at scale, on the harness
//! cluster with fake nodes beside the real one (`tests/cluster/kwok.sh up
//! N`). The API server, etcd, scheduler, controller-manager, the operator,
//! its webhook and pool controller are real; the sandbox pods are played by
//! KWOK (Running and Ready as soon as they are bound). Not a test: prints
//! figures. `scripts/bench-scale.sh` runs it from a cluster that is down.
//!
//! `BENCH_SCALE_OPERATOR_ARGS`: more flags for both operators (e.g.
//! `--max-concurrent-reconciles=64 --lease-duration-seconds=8
//! --lease-renew-deadline-seconds=5 --lease-retry-period-seconds=1`).
//!
//! Phases (`BENCH_SCALE_PHASES`, run in the order given; default all, in
//! this order; a phase may be given twice):
//! - ramp: sessions over `BENCH_SCALE_NAMESPACES` namespaces, created by
//!   `BENCH_SCALE_WRITERS` threads as fast as the API server takes them, in
//!   steps (`BENCH_SCALE_STEPS`, default 1000,5000,10000); at each step
//!   sessions/s to Ready, creation-to-Ready p50/p99 (a watch, no polling),
//!   the operator's RSS and CPU, its API requests per session made Ready
//!   (API server flow-control metrics, counted under its own
//!   ServiceAccount), the API server's, etcd's and kwok's RSS; then the same
//!   figures idle at the top step.
//! - churn: create, delete and suspend in turn at `BENCH_SCALE_CHURN_RATE`
//!   operations/s for `BENCH_SCALE_CHURN_SECONDS`. Suspending needs a
//!   claim-backed workspace (the webhook refuses it for emptyDir), so the
//!   suspends go to sessions made for them before the churn, each with a
//!   volume bound to its claim in advance (fake nodes have no storage for a
//!   provisioner to serve).
//! - warm: `BENCH_SCALE_WARM` sessions claimed at once from warm pools of
//!   100 over the fake nodes (one pool per namespace).
//! - failover: the leading operator killed; time until the standby holds the
//!   Lease, until a session created after the kill has its first status
//!   (reconciling resumed) and until it is Ready; then every
//!   session, pod and ConfigMap listed to find lost or duplicate ones.
//! - webhook: dry-run creates at `BENCH_SCALE_WEBHOOK_RATE`/s (default 200)
//!   for `BENCH_SCALE_WEBHOOK_SECONDS`; client p50/p99 and the API server's
//!   webhook-duration histogram.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::api::{ApiServer, metric_sum};
use e2e::scale::{
    self, ProcSample, SCALE_NS, Tracker, cluster_pids, cpu_share, operator_requests, proc_sample,
    sessions_path,
};
use e2e::{
    Certs, Kubectl, Operator, env_or, free_port, install_crd, percentile, register_webhook,
    unregister_webhook,
};
use serde_json::{Value, json};

const WEBHOOK: &str = "agentplane-scale";
/// What every namespace of a run starts with (`BENCH_SCALE_PREFIX`, default
/// `scale-`): two runs on one cluster use two prefixes, so that the first
/// one's namespaces may still be terminating.
fn prefix() -> &'static str {
    static P: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    P.get_or_init(|| std::env::var("BENCH_SCALE_PREFIX").unwrap_or_else(|_| "scale-".into()))
}

struct Bench {
    api: ApiServer,
    k: Kubectl,
    tracker: Arc<Tracker>,
    image: String,
    namespaces: usize,
    writers: usize,
    /// The operator whose figures are printed (the leader).
    leader_pid: u32,
    /// The operator standing by (its watches hold the same caches).
    standby_pid: Option<u32>,
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

impl Bench {
    fn ns(&self, i: usize) -> String {
        format!("{}{:03}", prefix(), i % self.namespaces)
    }

    /// POSTs `items` (collection path, object) from the writer threads, at
    /// most `rate` per second when given; records each creation time.
    /// Returns how many failed.
    fn create(&self, items: Vec<(String, Value)>, rate: Option<f64>) -> usize {
        let items = Arc::new(items);
        let next = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let threads: Vec<_> = (0..self.writers)
            .map(|_| {
                let (api, tracker, items, next, failed) = (
                    self.api.clone(),
                    self.tracker.clone(),
                    items.clone(),
                    next.clone(),
                    failed.clone(),
                );
                std::thread::spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((path, obj)) = items.get(i) else {
                            return;
                        };
                        if let Some(r) = rate {
                            let due = start + Duration::from_secs_f64(i as f64 / r);
                            std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        }
                        let key = format!(
                            "{}/{}",
                            obj["metadata"]["namespace"].as_str().unwrap_or_default(),
                            obj["metadata"]["name"].as_str().unwrap_or_default()
                        );
                        let mut ok = false;
                        for attempt in 0..5u32 {
                            let t = Instant::now();
                            let r = api.post(path, obj);
                            if r.ok() {
                                tracker.mark_created(key.clone(), t);
                                ok = true;
                                break;
                            }
                            if r.status == 409 {
                                break;
                            }
                            if attempt == 4 {
                                eprintln!("scale: create {key}: {} {}", r.status, r.body);
                            }
                            std::thread::sleep(Duration::from_millis(200 << attempt));
                        }
                        if !ok {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            let _ = t.join();
        }
        failed.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until every key is Ready; how many are.
    fn wait_ready(&self, keys: &[String], timeout: Duration) -> usize {
        let t0 = Instant::now();
        loop {
            let n = self.tracker.count_ready(keys);
            if n >= keys.len() || t0.elapsed() > timeout {
                return n;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn session_items(&self, names: impl Iterator<Item = (usize, String)>) -> Vec<(String, Value)> {
        names
            .map(|(i, name)| {
                let ns = self.ns(i);
                (
                    sessions_path(&ns),
                    scale::session(&ns, &name, &self.image, None),
                )
            })
            .collect()
    }

    /// The control plane's processes now.
    fn cluster_now(&self) -> BTreeMap<&'static str, ProcSample> {
        cluster_pids()
            .into_iter()
            .filter_map(|(n, pid)| Some((n, proc_sample(pid)?)))
            .collect()
    }

    /// Their RSS now and CPU since `before`.
    fn cluster_figures(&self, before: &BTreeMap<&'static str, ProcSample>) -> String {
        self.cluster_now()
            .into_iter()
            .map(|(n, now)| {
                let cpu = before.get(n).map_or(0.0, |b| cpu_share(b, &now));
                format!("{n} {} {cpu:.2} cores", mib(now.rss_kib))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One row of the ramp table.
struct Step {
    sessions: usize,
    ready: usize,
    rate: f64,
    p50: Duration,
    p99: Duration,
    rss_kib: u64,
    cpu: f64,
    requests: f64,
    cluster: String,
}

fn ramp(b: &Bench, steps: &[usize]) -> Vec<Step> {
    let mut rows = Vec::new();
    let mut have = 0;
    for &top in steps {
        if top <= have {
            continue;
        }
        let names: Vec<(usize, String)> = (have..top).map(|i| (i, format!("s-{i:05}"))).collect();
        let keys: Vec<String> = names
            .iter()
            .map(|(i, n)| format!("{}/{n}", b.ns(*i)))
            .collect();
        let before = proc_sample(b.leader_pid).unwrap_or_default();
        let cluster_before = b.cluster_now();
        let req_before = operator_requests(&b.api.metrics());
        let creating = Instant::now();
        let failed = b.create(b.session_items(names.into_iter()), None);
        let created_at = Instant::now();
        let create_secs = created_at.duration_since(creating).as_secs_f64();
        let ready = b.wait_ready(
            &keys,
            Duration::from_secs(env_or("BENCH_SCALE_STEP_TIMEOUT", 1200)),
        );
        let after = proc_sample(b.leader_pid).unwrap_or_default();
        let req_after = operator_requests(&b.api.metrics());
        let (n, rate, lat) = b.tracker.ready_figures(&keys);
        let delta: BTreeMap<&str, f64> = req_after
            .iter()
            .map(|(k, v)| (*k, v - req_before.get(k).copied().unwrap_or(0.0)))
            .collect();
        let total: f64 = delta.values().sum();
        println!(
            "ramp to {top}: {n} of {} new sessions Ready ({failed} creates failed; all created in {create_secs:.1} s, {:.1}/s; last create {:.1} s before the last Ready); {rate:.1} sessions/s from first create to last Ready; create->Ready p50 {} p99 {}",
            keys.len(),
            keys.len() as f64 / create_secs.max(0.001),
            created_at.elapsed().as_secs_f64(),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99))
        );
        let standby_rss = b
            .standby_pid
            .and_then(proc_sample)
            .map_or("-".into(), |s| mib(s.rss_kib));
        println!(
            "  operator: RSS {} after the step (the standby's {standby_rss}), CPU {:.2} cores over it; API requests {total:.0} = {:.1} per session made Ready ({})",
            mib(after.rss_kib),
            cpu_share(&before, &after),
            total / n.max(1) as f64,
            delta
                .iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let cluster = b.cluster_figures(&cluster_before);
        println!("  control plane (RSS, CPU over the step): {cluster}");
        rows.push(Step {
            sessions: top,
            ready,
            rate,
            p50: percentile(&lat, 0.5),
            p99: percentile(&lat, 0.99),
            rss_kib: after.rss_kib,
            cpu: cpu_share(&before, &after),
            requests: total / n.max(1) as f64,
            cluster,
        });
        have = top;
    }
    // Idle at the top: what the operator does with nothing to do.
    let before = proc_sample(b.leader_pid).unwrap_or_default();
    let req_before: f64 = operator_requests(&b.api.metrics()).values().sum();
    std::thread::sleep(Duration::from_secs(env_or("BENCH_SCALE_IDLE_SECONDS", 30)));
    let after = proc_sample(b.leader_pid).unwrap_or_default();
    let req_after: f64 = operator_requests(&b.api.metrics()).values().sum();
    let secs = match (before.at, after.at) {
        (Some(x), Some(y)) => (y - x).as_secs_f64(),
        _ => 1.0,
    };
    println!(
        "idle at {have}: operator RSS {}, CPU {:.3} cores, {:.2} API requests/s",
        mib(after.rss_kib),
        cpu_share(&before, &after),
        (req_after - req_before) / secs
    );
    println!(
        "| sessions | Ready | sessions/s to Ready | create->Ready p50 | p99 | operator RSS | operator CPU (cores) | API requests per session | control plane RSS, CPU |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {} | {} | {} | {:.2} | {:.1} | {} |",
            r.sessions,
            r.ready,
            r.rate,
            ms(r.p50),
            ms(r.p99),
            mib(r.rss_kib),
            r.cpu,
            r.requests,
            r.cluster
        );
    }
    rows
}

/// Counts a refused churn operation; prints the first few.
fn refused(errors: &mut usize, what: &str, name: &str, r: &e2e::api::Reply) {
    *errors += 1;
    if *errors <= 3 {
        eprintln!(
            "scale: churn {what} {name}: {} {}",
            r.status,
            r.body.chars().take(300).collect::<String>()
        );
    }
}

/// `n` sessions that may be suspended (a claim each, bound in advance to a
/// volume made for it), made Ready before the churn so that suspending them
/// is all the churn measures. Returns their (namespace, name).
fn suspendable_sessions(b: &Bench, n: usize) -> Vec<(String, String)> {
    let t0 = Instant::now();
    let mut keys = Vec::new();
    let mut out = Vec::new();
    for i in 0..n {
        let (ns, name) = (b.ns(i), format!("p-{i:05}"));
        let pv = b.api.post(
            "/api/v1/persistentvolumes",
            &scale::static_volume(&ns, &name),
        );
        let t = Instant::now();
        let r = b.api.post(
            &sessions_path(&ns),
            &scale::suspendable_session(&ns, &name, &b.image),
        );
        if !pv.ok() || !r.ok() {
            let bad = if pv.ok() { &r } else { &pv };
            eprintln!(
                "scale: suspendable {ns}/{name}: {} {}",
                bad.status,
                bad.body.chars().take(300).collect::<String>()
            );
            continue;
        }
        let key = format!("{ns}/{name}");
        b.tracker.mark_created(key.clone(), t);
        keys.push(key);
        out.push((ns, name));
    }
    let ready = b.wait_ready(&keys, Duration::from_secs(600));
    println!(
        "churn: {ready} of {n} claim-backed sessions to suspend Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    out
}

fn churn(b: &Bench) {
    let rate: f64 = env_or("BENCH_SCALE_CHURN_RATE", 30.0);
    let secs: f64 = env_or("BENCH_SCALE_CHURN_SECONDS", 60.0);
    let ops = (rate * secs) as usize;
    let suspendable = suspendable_sessions(b, ops.div_ceil(3));
    let start = Instant::now();
    let before = proc_sample(b.leader_pid).unwrap_or_default();
    let (mut created, mut suspend_at) = (Vec::new(), HashMap::new());
    let (mut deleted, mut errors) = (0, 0);
    let mut suspendable = suspendable.into_iter();
    let mut del_i = 0usize;
    for op in 0..ops {
        let due = start + Duration::from_secs_f64(op as f64 / rate);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        match op % 3 {
            0 => {
                let name = format!("c-{op:05}");
                let ns = b.ns(op);
                let t = Instant::now();
                let r = b.api.post(
                    &sessions_path(&ns),
                    &scale::session(&ns, &name, &b.image, None),
                );
                if r.ok() {
                    let key = format!("{ns}/{name}");
                    b.tracker.mark_created(key.clone(), t);
                    created.push(key);
                } else {
                    refused(&mut errors, "create", &name, &r);
                }
            }
            1 => {
                let (ns, name) = (b.ns(del_i), format!("s-{del_i:05}"));
                del_i += 1;
                let r = b.api.delete(&format!("{}/{name}", sessions_path(&ns)));
                if r.ok() {
                    deleted += 1
                } else {
                    refused(&mut errors, "delete", &name, &r);
                }
            }
            _ => {
                let Some((ns, name)) = suspendable.next() else {
                    continue;
                };
                let t = Instant::now();
                let r = b.api.merge_patch(
                    &format!("{}/{name}", sessions_path(&ns)),
                    &json!({"spec": {"suspended": true}}),
                );
                if r.ok() {
                    suspend_at.insert(format!("{ns}/{name}"), t);
                } else {
                    refused(&mut errors, "suspend", &name, &r);
                }
            }
        }
    }
    let sent = start.elapsed();
    b.wait_ready(&created, Duration::from_secs(300));
    let t0 = Instant::now();
    while b.tracker.suspended_figures(&suspend_at).len() < suspend_at.len()
        && t0.elapsed() < Duration::from_secs(300)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = proc_sample(b.leader_pid).unwrap_or_default();
    let (n, _, lat) = b.tracker.ready_figures(&created);
    let sus = b.tracker.suspended_figures(&suspend_at);
    println!(
        "churn at {:.0} ops/s for {:.0} s ({ops} operations, {errors} refused): {n} of {} created Ready, create->Ready p50 {} p99 {}; {} of {} suspended, patch->Suspended p50 {} p99 {}; {deleted} deleted; operator RSS {}, CPU {:.2} cores",
        rate,
        sent.as_secs_f64(),
        created.len(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        sus.len(),
        suspend_at.len(),
        ms(percentile(&sus, 0.5)),
        ms(percentile(&sus, 0.99)),
        mib(after.rss_kib),
        cpu_share(&before, &after)
    );
}

fn warm(b: &Bench) {
    let total: usize = env_or("BENCH_SCALE_WARM", 1000);
    let per_pool = 100;
    let pools = total.div_ceil(per_pool);
    let ns_of = |p: usize| format!("{}warm-{p:02}", prefix());
    for p in 0..pools {
        let ns = ns_of(p);
        let _ = b.api.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": ns, "labels": {"agentplane.dev/scale": "true"}}}),
        );
        let r = b.api.post(
            &format!("/apis/agentplane.dev/v1alpha1/namespaces/{ns}/agentwarmpools"),
            &scale::warm_pool(&ns, "p", &b.image, per_pool),
        );
        assert!(
            r.ok() || r.status == 409,
            "warm pool in {ns}: {} {}",
            r.status,
            r.body
        );
    }
    let t0 = Instant::now();
    let filled = loop {
        let ready: usize = (0..pools)
            .map(|p| {
                b.api
                    .get(&format!(
                        "/apis/agentplane.dev/v1alpha1/namespaces/{}/agentwarmpools/p",
                        ns_of(p)
                    ))
                    .json()
                    .and_then(|v| v["status"]["readyReplicas"].as_u64())
                    .unwrap_or(0) as usize
            })
            .sum();
        if ready >= pools * per_pool || t0.elapsed() > Duration::from_secs(600) {
            break ready;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!(
        "warm: {pools} pools of {per_pool} on the fake nodes, {filled} pods ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let items: Vec<(String, Value)> = (0..total)
        .map(|i| {
            let ns = ns_of(i % pools);
            let name = format!("w-{i:04}");
            (
                sessions_path(&ns),
                scale::session(&ns, &name, &b.image, Some("p")),
            )
        })
        .collect();
    let keys: Vec<String> = items
        .iter()
        .map(|(_, o)| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let started = Instant::now();
    let failed = b.create(items, None);
    let sent = started.elapsed();
    b.wait_ready(&keys, Duration::from_secs(600));
    let (n, rate, lat) = b.tracker.ready_figures(&keys);
    let mut claimed = 0;
    for p in 0..pools {
        if let Ok(list) = b.api.list_all(&sessions_path(&ns_of(p)), 500) {
            claimed += list
                .iter()
                .filter(|s| e2e::status_reason(s, "WarmPool").is_some_and(|(st, _)| st == "True"))
                .count();
        }
    }
    println!(
        "warm burst of {total} over {pools} pools: all created in {:.1} s ({failed} failed); {n} Ready ({claimed} claimed a warm pod, the rest cold); {rate:.1} sessions/s; create->Ready p50 {} p99 {}",
        sent.as_secs_f64(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
}

fn lease_holder(api: &ApiServer) -> Option<String> {
    api.get(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/{SCALE_NS}/leases/agentplane-operator"
    ))
    .json()?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

fn failover(b: &mut Bench, leader: Operator, standby: &Operator) {
    let t_kill = Instant::now();
    leader.kill();
    // Sessions created right after the kill: when the first turns Ready,
    // reconciling has resumed.
    let probes: Vec<(usize, String)> = (0..20).map(|i| (i, format!("f-{i:02}"))).collect();
    let keys: Vec<String> = probes
        .iter()
        .map(|(i, n)| format!("{}/{n}", b.ns(*i)))
        .collect();
    let failed = b.create(b.session_items(probes.into_iter()), None);
    let lease_at = {
        let t0 = Instant::now();
        loop {
            if lease_holder(&b.api).as_deref() == Some("scale-b") {
                break Some(t_kill.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(120) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    b.wait_ready(&keys, Duration::from_secs(600));
    let ready = b
        .tracker
        .ready
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut after: Vec<Duration> = keys
        .iter()
        .filter_map(|k| Some(ready.get(k)?.saturating_duration_since(t_kill)))
        .collect();
    after.sort();
    let first_status = {
        let statused = b.tracker.statused.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter()
            .filter_map(|k| Some(statused.get(k)?.saturating_duration_since(t_kill)))
            .min()
    };
    b.leader_pid = standby.pid();
    b.standby_pid = None;
    println!(
        "failover: leader killed; standby held the Lease after {}; reconciling resumed (the first status on a session created after the kill) after {}; of 20 sessions created after the kill ({failed} refused) {} Ready, the first {} and the last {} after the kill; standby RSS {}",
        lease_at.map_or("(not within 120 s)".into(), ms),
        first_status.map_or("-".into(), ms),
        after.len(),
        after.first().map_or("-".into(), |d| ms(*d)),
        after.last().map_or("-".into(), |d| ms(*d)),
        mib(proc_sample(standby.pid()).unwrap_or_default().rss_kib)
    );
    audit(b, "after failover");
}

fn audit(b: &Bench, when: &str) {
    // Let the garbage collector and the operator settle (bounded).
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < Duration::from_secs(180) {
        match scale::audit(&b.api, prefix()) {
            Ok(a) => {
                let settled = a.lost.is_empty() && a.duplicate.is_empty() && a.orphans == 0;
                last = Some(a);
                if settled {
                    break;
                }
            }
            Err(e) => eprintln!("scale: audit: {e}"),
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let Some(a) = last else {
        println!("audit {when}: could not list the objects");
        return;
    };
    println!(
        "audit {when} ({:.0} s to settle): {} sessions ({} Ready, {} Suspended), {} pods and {} ConfigMaps owned by sessions; {} lost, {} duplicate, {} orphaned objects",
        t0.elapsed().as_secs_f64(),
        a.sessions,
        a.ready,
        a.suspended,
        a.pods,
        a.configmaps,
        a.lost.len(),
        a.duplicate.len(),
        a.orphans
    );
    for l in a.lost.iter().take(10) {
        println!("  lost: {l}");
    }
    for d in a.duplicate.iter().take(10) {
        println!("  duplicate: {d}");
    }
}

/// The quantile `q` of a Prometheus histogram given as cumulative
/// (upper bound, count) pairs: the first bound holding that share.
fn histogram_bound(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

fn webhook_buckets(metrics: &str) -> Vec<(f64, f64)> {
    let mut bounds: Vec<(f64, String)> = metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_admission_webhook_admission_duration_seconds_bucket{"))
        .filter(|l| l.contains("name=\"agentsessions.agentplane.dev\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                },
                le.to_owned(),
            ))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    bounds.dedup_by(|a, b| a.1 == b.1);
    bounds
        .into_iter()
        .map(|(v, le)| {
            (
                v,
                metric_sum(
                    metrics,
                    "apiserver_admission_webhook_admission_duration_seconds_bucket",
                    &[("name", "agentsessions.agentplane.dev"), ("le", &le)],
                ),
            )
        })
        .collect()
}

fn webhook(b: &Bench) {
    let rate: f64 = env_or("BENCH_SCALE_WEBHOOK_RATE", 200.0);
    let secs: f64 = env_or("BENCH_SCALE_WEBHOOK_SECONDS", 15.0);
    let n = (rate * secs) as usize;
    let before = webhook_buckets(&b.api.metrics());
    let lat = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let next = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (api, lat, next, refused, image) = (
                b.api.clone(),
                lat.clone(),
                next.clone(),
                refused.clone(),
                b.image.clone(),
            );
            let namespaces = b.namespaces;
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    let ns = format!("{}{:03}", prefix(), i % namespaces);
                    let obj = scale::session(&ns, &format!("dry-{i:05}"), &image, None);
                    let t = Instant::now();
                    let r = api.post(&format!("{}?dryRun=All", sessions_path(&ns)), &obj);
                    let d = t.elapsed();
                    if r.ok() {
                        lat.lock().unwrap_or_else(|e| e.into_inner()).push(d);
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let took = start.elapsed();
    let after = webhook_buckets(&b.api.metrics());
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| {
            let was = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, c - was)
        })
        .collect();
    let mut lat = lat.lock().unwrap_or_else(|e| e.into_inner()).clone();
    lat.sort();
    let bound = |q| {
        histogram_bound(&delta, q).map_or("-".into(), |s: f64| format!("<= {:.0} ms", s * 1000.0))
    };
    println!(
        "webhook: {n} dry-run creates at {:.0}/s ({} refused); client round trip (API server + webhook) p50 {} p99 {}; the API server's webhook call p50 {} p99 {} (histogram bounds)",
        n as f64 / took.as_secs_f64(),
        refused.load(Ordering::Relaxed),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        bound(0.5),
        bound(0.99)
    );
}

fn main() {
    let k = Kubectl::from_env();
    let api = ApiServer::from_kubeconfig(&k.kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    let fake = api
        .get("/api/v1/nodes?labelSelector=type%3Dkwok")
        .json()
        .and_then(|v| v["items"].as_array().map(Vec::len))
        .unwrap_or(0);
    assert!(
        fake > 0,
        "no fake nodes: run tests/cluster/kwok.sh up 100 first"
    );
    install_crd(&k);
    let dir = tempfile::tempdir().expect("tempdir");
    let op_kubeconfig = scale::operator_identity(&k, &k.kubeconfig, dir.path());
    let certs = Certs::generate();
    let runner = e2e::runner_image();
    let extra = std::env::var("BENCH_SCALE_OPERATOR_ARGS").unwrap_or_default();
    let mut args = vec![
        "--runner-image",
        runner.as_str(),
        "--allow-node-selector",
        "type=kwok",
        "--allow-tolerations",
        // The churn's claim-backed sessions (scale::suspendable_session).
        "--allow-storage-class",
        scale::STATIC_CLASS,
        "--leader-elect",
        "--lease-namespace",
        SCALE_NS,
    ];
    args.extend(extra.split_whitespace());
    let log_dir = std::env::var("BENCH_SCALE_LOG_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().to_owned());
    let leader = Operator::start_with_env(
        &op_kubeconfig,
        &certs,
        free_port(),
        &log_dir.join("operator-a.log"),
        &args,
        &[("POD_NAME", "scale-a"), ("RUST_LOG", "info")],
    );
    let t0 = Instant::now();
    let api2 = api.clone();
    e2e::wait_for("scale-a to lead", Duration::from_secs(60), || {
        (lease_holder(&api2).as_deref() == Some("scale-a")).then_some(())
    });
    let standby_port = free_port();
    let standby = Operator::start_with_env(
        &op_kubeconfig,
        &certs,
        standby_port,
        &log_dir.join("operator-b.log"),
        &args,
        &[("POD_NAME", "scale-b"), ("RUST_LOG", "info")],
    );
    // The webhook is served by both; the API server calls the standby's,
    // which stays up when the leader is killed.
    let r = register_webhook(&k, WEBHOOK, &certs.ca_pem, standby_port);
    assert!(r.ok, "webhook: {}", r.stderr);
    println!(
        "scale: {fake} fake nodes; operator scale-a leads ({:.1} s), scale-b stands by",
        t0.elapsed().as_secs_f64()
    );

    let namespaces: usize = env_or("BENCH_SCALE_NAMESPACES", 100);
    for i in 0..namespaces {
        let r = api.post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": format!("{}{i:03}", prefix()), "labels": {"agentplane.dev/scale": "true"}}}),
        );
        assert!(
            r.ok() || r.status == 409,
            "namespace: {} {}",
            r.status,
            r.body
        );
    }
    let tracker = Arc::new(Tracker::default());
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (api, tracker, stop) = (api.clone(), tracker.clone(), stop.clone());
        std::thread::spawn(move || scale::follow_sessions(api, tracker, stop));
    }
    let mut b = Bench {
        api,
        k: k.clone(),
        tracker,
        image: e2e::sandbox_image(),
        namespaces,
        writers: env_or("BENCH_SCALE_WRITERS", 8),
        leader_pid: leader.pid(),
        standby_pid: Some(standby.pid()),
    };
    let phases = std::env::var("BENCH_SCALE_PHASES")
        .unwrap_or_else(|_| "ramp,churn,warm,failover,webhook".into());
    let steps: Vec<usize> = std::env::var("BENCH_SCALE_STEPS")
        .unwrap_or_else(|_| "1000,5000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // In the order given: e.g. `webhook,failover,webhook` measures the
    // webhook before the fail-over too.
    let mut leader = Some(leader);
    for phase in phases.split(',').map(str::trim) {
        match phase {
            "ramp" => {
                ramp(&b, &steps);
            }
            "churn" => churn(&b),
            "warm" => warm(&b),
            "failover" => match leader.take() {
                Some(l) => failover(&mut b, l, &standby),
                None => println!("failover: the leader was killed already"),
            },
            "webhook" => webhook(&b),
            other => println!("scale: no phase {other:?}"),
        }
    }
    if let Some(l) = leader {
        audit(&b, "at the end");
        drop(l);
    }
    stop.store(true, Ordering::Relaxed);
    if std::env::var("BENCH_SCALE_KEEP").is_err() {
        unregister_webhook(&b.k, WEBHOOK);
        let _ = b.k.run(
            &[
                "delete",
                "namespaces",
                "-l",
                "agentplane.dev/scale=true",
                "--wait=false",
            ],
            None,
        );
    }
    drop(standby);
}
