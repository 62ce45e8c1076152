//! Warm claim -> first tool result on the real cluster, next to the cold
//! path, in one run. Not a test: prints figures. Needs the harness cluster
//! up, the images built and the operator and kubectl-agent binaries (see
//! docs/benchmarks.md).
//!
//! Sequential: N sessions (default 50) naming a pool of `BENCH_POOL` pods
//! (default 8), one after another; each is timed from just before its
//! `kubectl apply` to the first `kubectl agent bash` result, through
//! `kubectl wait` on its phase (a watch, so no polling interval is
//! measured). Sessions that found the pool empty start cold and are counted
//! apart. The same procedure on sessions that name no pool gives the cold
//! figure, and on an already-Ready session the client floor (three kubectl
//! processes: what any figure here pays before the platform does anything).
//!
//! Burst: the pool is scaled to B pods (default 100), then B sessions are
//! created by ten `kubectl create` processes at once and a single watch
//! records when each turns Ready; each then gets one tool call from 8 client threads (the
//! tool-result figure so includes client queueing on this 2-core machine,
//! and is printed beside the Ready figure, which does not).

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, agent, env_or, free_port, install_crd, ms, percentile,
    runner_image, sandbox_image, wait_for,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(600);
const NS: &str = "bench-warm";

fn session_yaml(name: &str, pool: Option<&str>) -> String {
    let pool = pool.map_or_else(String::new, |p| format!("  warmPool: {p}\n"));
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n{pool}  tools: [{{type: agent_toolset_20260401}}]\n",
        sandbox_image()
    )
}

fn pool_yaml(replicas: usize) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentWarmPool\nmetadata:\n  name: py\nspec:\n  replicas: {replicas}\n  template:\n    image: {}\n",
        sandbox_image()
    )
}

struct Bench {
    k: Kubectl,
}

impl Bench {
    fn bash(&self, name: &str, cmd: &str) -> String {
        let (code, out, err) = agent(&self.k, NS, &["bash", name, "--", cmd]);
        assert_eq!(code, 0, "{name}: {err}");
        out
    }

    fn wait_ready(&self, name: &str) {
        self.k.must(&[
            "wait",
            "-n",
            NS,
            "--for=jsonpath={.status.phase}=Ready",
            &format!("agentsession/{name}"),
            "--timeout=300s",
        ]);
    }

    /// apply -> Ready -> first tool result, timed; whether it was warm.
    fn one(&self, name: &str, pool: Option<&str>) -> (Duration, bool) {
        let t0 = Instant::now();
        let r = self.k.run(
            &["apply", "-n", NS, "-f", "-"],
            Some(&session_yaml(name, pool)),
        );
        assert!(r.ok, "{}", r.stderr);
        self.wait_ready(name);
        let out = self.bash(name, "echo ok");
        let took = t0.elapsed();
        assert_eq!(out.trim(), "ok");
        (took, self.claimed(name))
    }

    fn claimed(&self, name: &str) -> bool {
        self.k
            .get(&["agentsession", name, "-n", NS])
            .and_then(|o| {
                let c = o["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "WarmPool")?
                    .clone();
                Some(c["status"] == "True")
            })
            .unwrap_or(false)
    }

    fn delete(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        let mut args = vec!["delete", "agentsession", "-n", NS, "--wait=false"];
        args.extend(names.iter().map(String::as_str));
        self.k.must(&args);
    }

    fn pool_ready(&self, n: usize) {
        wait_for(&format!("{n} ready pods in the pool"), T, || {
            let o = self.k.get(&["agentwarmpool", "py", "-n", NS])?;
            (o["status"]["readyReplicas"].as_u64() == Some(n as u64)).then_some(())
        });
    }

    fn scale(&self, n: usize) {
        self.k.must(&[
            "scale",
            "agentwarmpool",
            "py",
            "-n",
            NS,
            &format!("--replicas={n}"),
        ]);
    }

    fn no_sessions(&self) {
        wait_for("the sessions' pods to go", T, || {
            let pods = self
                .k
                .get(&["pods", "-n", NS, "-l", "agentplane.dev/session"])?;
            pods["items"]
                .as_array()
                .is_some_and(|a| a.is_empty())
                .then_some(())
        });
    }

    /// Applies `names` at once; when each turned Ready (from the watch) and
    /// when its first tool result came (8 client threads).
    fn burst(&self, names: &[String], pool: Option<&str>) -> (Vec<Duration>, Vec<Duration>) {
        let mut watch = Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()))
            .args(["get", "agentsessions", "-n", NS, "-w", "-o", "json"])
            .env("KUBECONFIG", &self.k.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get -w");
        let stdout = watch.stdout.take().expect("stdout");
        let ready_at: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
        let wanted: BTreeSet<String> = names.iter().cloned().collect();
        let recorder = {
            let ready_at = ready_at.clone();
            std::thread::spawn(move || {
                let stream = serde_json::Deserializer::from_reader(BufReader::new(stdout))
                    .into_iter::<Value>();
                for o in stream.flatten() {
                    let name = o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    if o["status"]["phase"] == "Ready" && wanted.contains(&name) {
                        let mut m = ready_at.lock().expect("lock");
                        m.entry(name).or_insert_with(Instant::now);
                        if m.len() == wanted.len() {
                            return;
                        }
                    }
                }
            })
        };
        // Let the watch start before the clock does.
        std::thread::sleep(Duration::from_millis(500));
        // Ten `kubectl create` processes of ten sessions each: one kubectl
        // would pace the burst itself (its client-side limit is 5 requests
        // a second after a burst of 10), which measures kubectl, not claims.
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for chunk in names.chunks(10) {
                let all: String = chunk
                    .iter()
                    .map(|n| format!("---\n{}", session_yaml(n, pool)))
                    .collect();
                s.spawn(move || {
                    let r = self.k.run(&["create", "-n", NS, "-f", "-"], Some(&all));
                    assert!(r.ok, "{}", r.stderr);
                });
            }
        });
        let queue = Arc::new(Mutex::new(names.to_vec()));
        let results: Arc<Mutex<Vec<Duration>>> = Arc::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (queue, results) = (queue.clone(), results.clone());
                s.spawn(move || {
                    loop {
                        let Some(name) = queue.lock().expect("lock").pop() else {
                            return;
                        };
                        self.wait_ready(&name);
                        let out = self.bash(&name, "echo ok");
                        assert_eq!(out.trim(), "ok");
                        results.lock().expect("lock").push(t0.elapsed());
                    }
                });
            }
        });
        let _ = recorder.join();
        let _ = watch.kill();
        let _ = watch.wait();
        let ready: Vec<Duration> = ready_at
            .lock()
            .expect("lock")
            .values()
            .map(|t| t.saturating_duration_since(t0))
            .collect();
        let results = results.lock().expect("lock").clone();
        (ready, results)
    }
}

fn summary(label: &str, mut v: Vec<Duration>) {
    v.sort();
    if v.is_empty() {
        println!("{label}: no samples");
        return;
    }
    println!(
        "{label}: n={} p50 {} p90 {} p99 {} max {}",
        v.len(),
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.9)),
        ms(percentile(&v, 0.99)),
        ms(*v.last().expect("non-empty"))
    );
}

fn main() {
    let seq: usize = env_or("BENCH_SEQ", 50);
    let cold_n: usize = env_or("BENCH_COLD", 20);
    let burst_n: usize = env_or("BENCH_BURST", 100);
    let pool_n: usize = env_or("BENCH_POOL", 8);
    let k = Kubectl::from_env();
    install_crd(&k);
    let logs = tempfile::tempdir().expect("tempdir");
    let log = std::env::var("BENCH_OPERATOR_LOG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| logs.path().join("operator.log"));
    let certs = Certs::generate();
    let runner = runner_image();
    let _op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        &log,
        &["--runner-image", &runner],
    );
    let _ns = Namespace::create(&k, NS, &[]);
    let b = Bench { k };
    let r =
        b.k.run(&["apply", "-n", NS, "-f", "-"], Some(&pool_yaml(pool_n)));
    assert!(r.ok, "{}", r.stderr);
    b.pool_ready(pool_n);

    // The client floor: the same three processes on a session already Ready.
    let (_, _) = b.one("floor", None);
    let mut floor = Vec::new();
    for _ in 0..10 {
        floor.push(b.one("floor", None).0);
    }
    b.delete(&["floor".to_owned()]);

    // Sequential warm claims; the pool refills between them as it can.
    let mut warm = Vec::new();
    let mut fell_back = Vec::new();
    for i in 0..seq {
        let name = format!("w-{i:03}");
        let (took, claimed) = b.one(&name, Some("py"));
        if claimed {
            warm.push(took);
        } else {
            fell_back.push(took);
            if std::env::var_os("BENCH_VERBOSE").is_some() {
                eprintln!(
                    "{name} not claimed: {}",
                    b.k.get(&["agentsession", &name, "-n", NS])
                        .map(|o| o["status"].to_string())
                        .unwrap_or_default()
                );
            }
        }
        b.delete(&[name]);
    }
    // Sequential cold starts.
    let mut cold = Vec::new();
    for i in 0..cold_n {
        let name = format!("c-{i:03}");
        cold.push(b.one(&name, None).0);
        b.delete(&[name]);
    }
    b.no_sessions();

    println!(
        "machine: {} cores; pool of {pool_n} for the sequential runs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    summary(
        "client floor (apply no-op + wait + kubectl agent bash, Ready session)",
        floor.clone(),
    );
    summary("warm claim -> first tool result, sequential", warm.clone());
    summary("  of which fell back cold (pool empty)", fell_back);
    summary("cold apply -> first tool result, sequential", cold.clone());
    let floor_p50 = {
        let mut f = floor;
        f.sort();
        percentile(&f, 0.5)
    };
    let less = |v: &[Duration]| -> Vec<Duration> {
        v.iter().map(|d| d.saturating_sub(floor_p50)).collect()
    };
    summary("warm, less the client floor's p50", less(&warm));
    summary("cold, less the client floor's p50", less(&cold));

    if burst_n == 0 {
        return;
    }
    // Bursts: warm (a pool of burst_n), then cold.
    b.scale(burst_n);
    b.pool_ready(burst_n);
    let names: Vec<String> = (0..burst_n).map(|i| format!("bw-{i:03}")).collect();
    let (ready, results) = b.burst(&names, Some("py"));
    let claimed = names.iter().filter(|n| b.claimed(n)).count();
    summary(
        &format!("warm burst of {burst_n}: apply -> Ready ({claimed} claimed warm)"),
        ready,
    );
    summary(
        &format!("warm burst of {burst_n}: apply -> first tool result (8 client threads)"),
        results,
    );
    b.scale(0);
    b.delete(&names);
    b.no_sessions();
    let names: Vec<String> = (0..burst_n).map(|i| format!("bc-{i:03}")).collect();
    let (ready, results) = b.burst(&names, None);
    summary(&format!("cold burst of {burst_n}: apply -> Ready"), ready);
    summary(
        &format!("cold burst of {burst_n}: apply -> first tool result (8 client threads)"),
        results,
    );
    b.delete(&names);
}
