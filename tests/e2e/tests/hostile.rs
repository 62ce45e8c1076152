//! Hostile inputs against the operator on the real API server and kubelet:
//! MCP servers that redirect, flood, fail at random or list too many tools,
//! and a stored session the operator cannot decode. Each runs its own
//! operator process; run with `--test-threads=1` (they share the cluster).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, fail_with_log, free_port, http_get, install_crd,
    peak_rss_kib, root, runner_image, sandbox_image, status_reason, wait_for,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(180);
/// How long the operator is watched for hot loops.
const WATCH: Duration = Duration::from_secs(60);

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> String {
    std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Events about `name` in `ns`, counted as the API server aggregates them
/// (an event's own count, or its series count).
fn event_count(k: &Kubectl, ns: &str, name: &str) -> u64 {
    let list = k
        .get(&[
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ])
        .unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e.pointer("/series/count")
                .and_then(Value::as_u64)
                .or_else(|| e["count"].as_u64())
                .unwrap_or(1)
                .max(1)
        })
        .sum()
}

/// Four sessions, each drawing tools from a hostile MCP server, watched for
/// a minute once settled: the sandbox pods run and are kept, the sessions
/// say Degraded, the redirect target never sees a request, the operator's
/// memory stays bounded, and status writes and events stay a handful.
#[test]
fn hostile_mcp_servers_cause_no_hot_loop_and_no_harm() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    if let Err(e) = std::panic::catch_unwind(|| hostile_mcp(&k, &log)) {
        fail_with_log(&log, e);
    }
}

fn hostile_mcp(k: &Kubectl, log: &std::path::Path) {
    install_crd(k);
    let port = free_port();
    let _server = Reaped(
        Command::new(python())
            .arg(root().join("tests/e2e/hostile_mcp.py"))
            .arg(port.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("the hostile MCP server starts"),
    );
    wait_for("the hostile MCP server", Duration::from_secs(20), || {
        http_get(port, "/hits").map(|_| ())
    });
    let certs = Certs::generate();
    let runner = runner_image();
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner, "--mcp-timeout-seconds", "5"],
    );
    let ns = Namespace::create(k, "e2e-hostile-mcp", &[]);
    let cases = [
        ("redirect", "ServerUnavailable"),
        ("huge", "ServerUnavailable"),
        ("flaky", "ServerUnavailable"),
        ("many", "TooManyTools"),
    ];
    for (path, _) in cases {
        let yaml = format!(
            "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {path}\nspec:\n  image: {}\n  mcpServers:\n    - {{type: url, name: s, url: \"http://127.0.0.1:{port}/{path}\"}}\n  tools:\n    - type: agent_toolset_20260401\n    - type: mcp_toolset\n      mcp_server_name: s\n",
            sandbox_image()
        );
        let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&yaml));
        assert!(r.ok, "{path}: {}", r.stderr);
    }
    let pod_uid = |session: &str| {
        let pod = format!("{session}-sandbox");
        k.must(&[
            "get",
            "pod",
            &pod,
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    // Settled: every sandbox runs, Degraded names what is missing.
    let mut pod_uids = Vec::new();
    for (path, reason) in cases {
        let obj = wait_for(&format!("{path}: Ready and Degraded"), T, || {
            let o = k.get(&["agentsession", path, "-n", &ns.name])?;
            (o["status"]["phase"] == "Ready"
                && status_reason(&o, "Degraded") == Some(("True".into(), reason.into())))
            .then_some(o)
        });
        assert_eq!(
            status_reason(&obj, "McpResolved").map(|c| c.1).as_deref(),
            Some(reason),
            "{path}"
        );
        let msg = serde_json::to_string(&obj["status"]["conditions"]).expect("json");
        assert!(
            !msg.contains("exploded"),
            "{path}: an upstream body reached status: {msg}"
        );
        let uid = pod_uid(path);
        pod_uids.push(uid);
    }
    // A minute of watching.
    let events_before: Vec<u64> = cases
        .iter()
        .map(|(p, _)| event_count(k, &ns.name, p))
        .collect();
    let mut watch = Reaped(
        Command::new(&k.bin)
            .args(["--kubeconfig", &k.kubeconfig])
            .args([
                "get",
                "agentsessions",
                "-n",
                &ns.name,
                "--watch-only",
                "-o",
                "jsonpath={.metadata.name} {.metadata.resourceVersion}{\"\\n\"}",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl watch"),
    );
    let started = Instant::now();
    while started.elapsed() < WATCH {
        std::thread::sleep(Duration::from_secs(1));
    }
    // One change of our own, so the count is known to see writes at all.
    k.must(&[
        "annotate",
        "agentsession",
        "redirect",
        "-n",
        &ns.name,
        "e2e/marker=1",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let _ = watch.0.kill();
    let out = watch.0.wait_with_output_after_kill();
    let lines = out.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(
        lines >= 1,
        "the watch saw not even the test's own annotation"
    );
    let writes = lines - 1;
    let events_after: Vec<u64> = cases
        .iter()
        .map(|(p, _)| event_count(k, &ns.name, p))
        .collect();
    let new_events: u64 = events_after
        .iter()
        .zip(&events_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum();
    let hits = http_get(port, "/hits").unwrap_or_default();
    let rss_mib = peak_rss_kib(op.pid()).unwrap_or(0) / 1024;
    eprintln!(
        "hostile MCP, {}s: {writes} session writes, {new_events} new events, redirect target hit: {:?}, operator peak RSS {rss_mib} MiB",
        WATCH.as_secs(),
        hits.rsplit("\r\n").next().unwrap_or_default()
    );
    // Four sessions re-listed every 30 s for a minute: a write or an event
    // per session per pass would be 8 of each; a hot loop, thousands.
    assert!(writes <= 8, "{writes} status writes in a minute:\n{out}");
    assert!(new_events <= 4, "{new_events} new events in a minute");
    assert!(
        hits.ends_with("\r\n\r\n0") || hits.ends_with("\n0"),
        "the redirect was followed: {hits}"
    );
    assert!(
        rss_mib < 200,
        "the operator's peak RSS reached {rss_mib} MiB"
    );
    // The sandboxes were never replaced.
    for ((path, _), uid) in cases.iter().zip(&pod_uids) {
        let now = pod_uid(path);
        assert_eq!(&now, uid, "{path}: the sandbox pod was replaced");
    }
    drop(op);
}

trait WaitAfterKill {
    fn wait_with_output_after_kill(&mut self) -> String;
}

impl WaitAfterKill for Child {
    fn wait_with_output_after_kill(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut out) = self.stdout.take() {
            let _ = out.read_to_string(&mut s);
        }
        let _ = self.wait();
        s
    }
}

/// A session stored in a shape the operator cannot decode (the CRD was
/// loosened, as an older or newer CRD might be) gets an Unreadable status
/// naming the field, and does not stop the operator from serving every
/// other session. The CRD is restored afterwards.
#[test]
fn an_undecodable_session_does_not_stall_the_others() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    let result = std::panic::catch_unwind(|| undecodable(&k, &log));
    let _ = k.run(
        &[
            "delete",
            "agentsession",
            "no-image",
            "-n",
            "e2e-unreadable",
            "--ignore-not-found",
        ],
        None,
    );
    install_crd(&k);
    if let Err(e) = result {
        fail_with_log(&log, e);
    }
}

fn undecodable(k: &Kubectl, log: &std::path::Path) {
    install_crd(k);
    // The CRD without `image` among spec's required fields.
    let crd = k
        .get(&["crd", "agentsessions.agentplane.dev"])
        .expect("the CRD");
    let required = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let idx = required
        .iter()
        .position(|v| v == "image")
        .expect("image is required by the shipped CRD");
    let patch = format!(
        r#"[{{"op":"remove","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/required/{idx}"}}]"#
    );
    k.must(&[
        "patch",
        "crd",
        "agentsessions.agentplane.dev",
        "--type=json",
        "-p",
        &patch,
    ]);
    let ns = Namespace::create(k, "e2e-unreadable", &[]);
    wait_for(
        "the loosened CRD to be served",
        Duration::from_secs(30),
        || {
            let r = k.run(
            &["apply", "-n", &ns.name, "-f", "-"],
            Some("apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: no-image\nspec:\n  workdir: /workspace\n  tools: [{type: agent_toolset_20260401}]\n"),
        );
            r.ok.then_some(())
        },
    );
    let runner = runner_image();
    let certs = Certs::generate();
    let _op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner],
    );
    // A good session next to it is served.
    let good = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: fine\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n",
        sandbox_image()
    );
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&good));
    assert!(r.ok, "{}", r.stderr);
    wait_for("the good session to be Ready", T, || {
        let o = k.get(&["agentsession", "fine", "-n", &ns.name])?;
        (o["status"]["phase"] == "Ready").then_some(())
    });
    // The bad one says why, by path, and runs nothing.
    let obj = wait_for("an Unreadable status", T, || {
        let o = k.get(&["agentsession", "no-image", "-n", &ns.name])?;
        (status_reason(&o, "Ready") == Some(("False".into(), "Unreadable".into()))).then_some(o)
    });
    assert_eq!(obj["status"]["phase"], "Invalid");
    let msg = obj
        .pointer("/status/conditions/0/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        msg.contains("spec") && msg.contains("image"),
        "the message names the field: {msg}"
    );
    assert!(
        k.get(&["pod", "no-image-sandbox", "-n", &ns.name])
            .is_none(),
        "no pod for an unreadable session"
    );
}
