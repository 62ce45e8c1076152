//! Checkpoint and fork against workspace size and file count, on the real
//! node with the chart installed (the operator relaying runner to sink over
//! mutual TLS, as in production). Not a test: prints figures
//! (docs/benchmarks.md). Needs the harness cluster up, the images built and
//! helm on PATH (HELM).
//!
//! For each case -- one 10 MiB file, one large file (`BENCH_CKPT_LARGE_MIB`,
//! default 1024), `BENCH_CKPT_FILES` small files (default 100 000) -- a
//! source session makes the data, `cd`s and exports a variable; then:
//! - the floor: reading every byte once inside the sandbox (`cat | wc -c`,
//!   timed by bash), what any copy of the data pays at least;
//! - checkpoint: `kubectl apply` of the AgentCheckpoint -> phase Ready (a
//!   watch, `kubectl wait`), with its size, entries and MiB/s;
//! - fork: `BENCH_CKPT_FORKS` (default 2) sessions from it, one after the
//!   other, each timed apply -> Ready and apply -> first tool result (a
//!   bash call that checks the variable, the cwd and the data's size);
//! - cold: the same session shape without `from`, apply -> first result,
//!   in the same run: the fork figure's baseline (ratio printed).
//!
//! Each case's checkpoint claim is provisioned by the cluster's default
//! StorageClass (local-path-provisioner in the harness); the case's
//! objects are deleted before the next.
//!
//! `BENCH_CKPT_STORAGE=snapshot` runs the same cases with every session on
//! a claim in the harness's StorageClass with snapshots
//! (`agentplane-snapshot`): the checkpoint is then a VolumeSnapshot cut
//! while the runner holds the workspace, and forks' claims are made from
//! it (docs/checkpoints.md); the cold baseline is on such a claim too.

use std::time::{Duration, Instant};

use e2e::release::Release;
use e2e::{Kubectl, Namespace, agent, env_or, ms, sandbox_image};

const SYSTEM: &str = "bench-ckpt-system";
const NS: &str = "bench-ckpt";
const MIB: u64 = 1 << 20;

/// One shape of workspace: how the source makes it, how its bytes are read
/// for the floor, and what the fork checks.
struct Case {
    name: &'static str,
    make: String,
    read_all: &'static str,
    /// `wc -c` of `read_all`'s output in the fork: the data arrived whole.
    bytes: u64,
    max_bytes: Option<u64>,
}

fn cases() -> Vec<Case> {
    let large_mib: u64 = env_or("BENCH_CKPT_LARGE_MIB", 1024);
    let files: u64 = env_or("BENCH_CKPT_FILES", 100_000);
    let dirs = files.div_ceil(1000).max(1);
    let per_dir = files.min(1000);
    vec![
        Case {
            name: "10mib",
            make: format!("head -c {} /dev/urandom > data/blob", 10 * MIB),
            read_all: "cat data/blob",
            bytes: 10 * MIB,
            max_bytes: None,
        },
        Case {
            name: "large",
            make: format!("head -c {} /dev/zero > data/blob", large_mib * MIB),
            read_all: "cat data/blob",
            bytes: large_mib * MIB,
            // Its volume: this plus an eighth plus 16 MiB (docs/checkpoints.md).
            max_bytes: Some(large_mib * MIB + 64 * MIB),
        },
        Case {
            name: "files",
            // Builtins only: one redirection per file, no process per file.
            make: format!(
                "for d in $(seq 1 {dirs}); do mkdir -p data/$d; for f in $(seq 1 {per_dir}); do printf '%07d\\n' $f > data/$d/$f; done; done"
            ),
            read_all: "cat data/*/*",
            bytes: dirs * per_dir * 8,
            max_bytes: None,
        },
    ]
}

/// The StorageClass with snapshots in the harness.
const SNAPSHOT_CLASS: &str = "agentplane-snapshot";

/// A session; on a claim of `claim` bytes in [`SNAPSHOT_CLASS`] when given.
fn session_yaml(name: &str, from: Option<&str>, claim: Option<u64>) -> String {
    let from = from.map_or_else(String::new, |c| format!("  from: {{checkpoint: {c}}}\n"));
    let workspace = claim.map_or_else(String::new, |bytes| {
        format!(
            "  workspace:\n    volumeClaimTemplate:\n      spec: {{storageClassName: {SNAPSHOT_CLASS}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {bytes}}}}}}}\n"
        )
    });
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n{from}{workspace}",
        sandbox_image()
    )
}

fn checkpoint_yaml(name: &str, source: &str, max_bytes: Option<u64>) -> String {
    let max = max_bytes.map_or_else(String::new, |b| format!("  maxBytes: {b}\n"));
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentCheckpoint\nmetadata:\n  name: {name}\nspec:\n  source: {{session: {source}}}\n{max}"
    )
}

struct Bench {
    k: Kubectl,
    /// Sessions on claims with snapshots (`BENCH_CKPT_STORAGE=snapshot`).
    snapshot: bool,
}

impl Bench {
    fn apply(&self, yaml: &str) {
        let r = self.k.run(&["apply", "-n", NS, "-f", "-"], Some(yaml));
        assert!(r.ok, "apply: {}\n{yaml}", r.stderr);
    }

    fn wait_phase(&self, kind: &str, name: &str, phase: &str) {
        let r = self.k.run(
            &[
                "wait",
                "-n",
                NS,
                &format!("--for=jsonpath={{.status.phase}}={phase}"),
                &format!("{kind}/{name}"),
                "--timeout=1800s",
            ],
            None,
        );
        if !r.ok {
            let o = self
                .k
                .run(&["get", kind, name, "-n", NS, "-o", "yaml"], None);
            panic!("{kind} {name} never {phase}: {}\n{}", r.stderr, o.stdout);
        }
    }

    fn bash(&self, session: &str, command: &str) -> String {
        let (code, out, err) = agent(&self.k, NS, &["bash", session, "--", command]);
        assert_eq!(code, 0, "{session}: {command}: {out}{err}");
        out.trim().to_owned()
    }

    fn delete(&self, kind: &str, name: &str) {
        let _ = self.k.run(
            &[
                "delete",
                kind,
                name,
                "-n",
                NS,
                "--wait=true",
                "--timeout=300s",
            ],
            None,
        );
    }

    /// apply -> Ready and apply -> first result of a session (a fork when
    /// `from` is given), whose first call is `check`; its output.
    fn start(
        &self,
        name: &str,
        from: Option<&str>,
        claim: Option<u64>,
        check: &str,
    ) -> (Duration, Duration, String) {
        let t0 = Instant::now();
        self.apply(&session_yaml(name, from, claim));
        self.wait_phase("agentsession", name, "Ready");
        let ready = t0.elapsed();
        let out = self.bash(name, check);
        (ready, t0.elapsed(), out)
    }

    fn case(&self, case: &Case, forks: usize) {
        let src = format!("src-{}", case.name);
        // Room for the data, bash's state and the filesystem's own.
        let claim = self.snapshot.then_some(case.bytes + 256 * MIB);
        let (_, cold_first, _) = self.start(&src, None, claim, "true");
        let t = Instant::now();
        self.bash(
            &src,
            &format!(
                "mkdir -p data && {} && cd data && export BENCH_VAR={}",
                case.make, case.name
            ),
        );
        figure(
            case.name,
            "make_s",
            format!("{:.1}", t.elapsed().as_secs_f64()),
        );
        let floor = self.bash(
            &src,
            &format!(
                // A subshell: the session's cwd is part of what is checkpointed.
                "(cd /workspace; TIMEFORMAT=%R; {{ time {} | wc -c >/dev/null; }} 2>&1)",
                case.read_all
            ),
        );
        figure(case.name, "read_all_in_sandbox_s", floor.trim());

        let ckpt = format!("ckpt-{}", case.name);
        let t = Instant::now();
        // A snapshot holds the whole claim: no maxBytes below its size
        // (one would make the operator archive instead).
        let max_bytes = case.max_bytes.filter(|_| !self.snapshot);
        self.apply(&checkpoint_yaml(&ckpt, &src, max_bytes));
        self.wait_phase("agentcheckpoint", &ckpt, "Ready");
        let took = t.elapsed();
        let status = self
            .k
            .get(&["agentcheckpoint", &ckpt, "-n", NS])
            .expect("the checkpoint");
        let size = status["status"]["sizeBytes"].as_u64().unwrap_or(0);
        figure(case.name, "checkpoint_ms", ms(took));
        figure(case.name, "checkpoint_bytes", size);
        figure(
            case.name,
            "checkpoint_entries",
            &status["status"]["entries"],
        );
        figure(case.name, "checkpoint_method", &status["status"]["method"]);
        figure(
            case.name,
            "checkpoint_mib_per_s",
            format!("{:.1}", size as f64 / MIB as f64 / took.as_secs_f64()),
        );

        let check = format!(
            "echo $BENCH_VAR $(pwd) $(cd /workspace && {} | wc -c)",
            case.read_all
        );
        let want = format!("{} /workspace/data {}", case.name, case.bytes);
        let mut firsts = Vec::new();
        for i in 0..forks {
            let name = format!("fork-{}-{i}", case.name);
            let (ready, first, out) = self.start(&name, Some(&ckpt), claim, &check);
            assert_eq!(out, want, "{name} starts from the checkpoint's state");
            figure(case.name, &format!("fork{i}_ready_ms"), ms(ready));
            figure(case.name, &format!("fork{i}_first_result_ms"), ms(first));
            firsts.push(first);
            self.delete("agentsession", &name);
        }
        let cold_name = format!("cold-{}", case.name);
        let (_, cold, _) = self.start(&cold_name, None, claim, "true");
        self.delete("agentsession", &cold_name);
        figure(case.name, "cold_first_result_ms", ms(cold));
        figure(case.name, "source_cold_first_result_ms", ms(cold_first));
        if let Some(best) = firsts.iter().min() {
            figure(
                case.name,
                "fork_over_cold",
                format!("{:.2}", best.as_secs_f64() / cold.as_secs_f64()),
            );
        }
        self.delete("agentcheckpoint", &ckpt);
        self.delete("agentsession", &src);
    }
}

fn figure(case: &str, name: &str, value: impl std::fmt::Display) {
    println!("figure: {case} {name} {value}");
}

fn main() {
    let k = Kubectl::from_env();
    let forks: usize = env_or("BENCH_CKPT_FORKS", 2);
    let only = std::env::var("BENCH_CKPT_CASES").unwrap_or_default();
    let snapshot = std::env::var("BENCH_CKPT_STORAGE").is_ok_and(|s| s == "snapshot");
    let allow = format!("sessionPolicy.storageClasses={{{SNAPSHOT_CLASS}}}");
    let extra: &[&str] = if snapshot { &["--set", &allow] } else { &[] };
    let release = Release::install(&k, "agentplane", SYSTEM, extra);
    let ns = Namespace::create(&k, NS, &[]);
    let bench = Bench {
        k: k.clone(),
        snapshot,
    };
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for case in cases() {
            if only.is_empty() || only.split(',').any(|c| c == case.name) {
                bench.case(&case, forks);
            }
        }
    }));
    if run.is_err() {
        release.dump(
            120,
            &ns.name,
            &["agentcheckpoints", "agentsessions", "pods", "pvc", "events"],
        );
    }
    drop(ns);
    drop(release);
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
}
