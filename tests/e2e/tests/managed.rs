//! Claude Managed Agents sessions served by the plane, on the real node:
//! the chart installs the dispatcher, an `AgentEnvironment` points it at a
//! stand-in of the Managed Agents API (tests/managed/standin.py, itself
//! checked against the official `EnvironmentWorker`), and
//!
//! - the scripted session (six tools, an `ask` allowed and one denied, a
//!   `deny`, a bash past its timeout, 200 KiB of output, a custom tool
//!   nobody owns) completes, and its results equal, call by call, the ones
//!   the official worker posted, except where docs/DIVERGENCES.md says why;
//! - the agent's skill and the session's memory store are in the sandbox
//!   before its calls run, and the agent's memory changes are synced back
//!   with the item's own token;
//! - the sandbox holds no Anthropic credential (env, files, mounts) and
//!   cannot reach the stand-in;
//! - a dispatcher killed mid-session is replaced and runs no call twice;
//! - a key rotated in the Secret is used on the next poll;
//! - it all starts from a stale gateway directory entry an earlier release
//!   left behind.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::standin::{StandIn, environment_yaml, script, text};
use e2e::{Kubectl, Namespace, helm, node_ip, root, wait_for};
use serde_json::{Value, json};

const RELEASE: &str = "agentplane";
const RELEASE_NS: &str = "agentplane-ma";
const TENANT: &str = "ma-tenant";
const KEY_ONE: &str = "sk-ant-env-one-0123456789";
const KEY_TWO: &str = "sk-ant-env-two-9876543210";

#[test]
fn managed_agents_sessions_run_in_the_cluster() {
    let k = Kubectl::from_env();
    let host = node_ip(&k);
    let standin = StandIn::start(&host, &[KEY_ONE], 20);
    let chart = root().join("charts/agentplane");
    let _ = helm(&k, &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    stale_gateway_entry(&k);
    let r = helm(
        &k,
        &[
            "install",
            RELEASE,
            chart.to_str().expect("path"),
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "--set",
            "managedAgents.enabled=true",
            "--set",
            &format!("managedAgents.apiUrl={}", standin.url),
            "--set",
            "managedAgents.logFilter=info\\,dispatcher=debug\\,kube=warn",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    assert!(r.ok, "helm install: {}\n{}", r.stdout, r.stderr);
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| walk(&k, &standin, &host)));
    if result.is_err() {
        for app in [
            "agentplane-dispatcher",
            "agentplane-gateway",
            "agentplane-operator",
        ] {
            eprintln!(
                "{}",
                k.run(
                    &[
                        "-n",
                        RELEASE_NS,
                        "logs",
                        "-l",
                        &format!("app.kubernetes.io/name={app}"),
                        "--tail=150",
                        "--prefix"
                    ],
                    None
                )
                .stdout
            );
        }
        eprintln!("stand-in log:\n{}", standin.log_tail());
    }
    let _ = helm(&k, &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The starting condition an earlier release leaves: its gateway's
/// directory entry (it outlives `helm uninstall`) naming an address nobody
/// serves and a CA nobody signs with. The dispatcher of the new release
/// must follow the entry the new operator writes, not keep this one.
fn stale_gateway_entry(k: &Kubectl) {
    let ca = rcgen::generate_simple_self_signed(vec!["stale.invalid".into()])
        .expect("a throwaway CA")
        .cert
        .pem();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        // Labelled as the operator labels what it makes: an earlier
        // release's entry is the operator's, which the write fence lets it
        // rewrite (an unlabelled one it may not touch).
        "metadata": {"name": "agentplane-gateway", "namespace": "kube-public",
                     "labels": {"app.kubernetes.io/managed-by": "agentplane"}},
        "data": {
            "url": "https://agentplane-gateway.gone.svc:443",
            "address": "10.96.255.254:443",
            "ca.crt": ca,
        }
    });
    let r = k.apply(&cm.to_string());
    assert!(r.ok, "the stale directory entry: {}", r.stderr);
}

fn tenant(k: &Kubectl, ns: &str) {
    let r = k.apply(&environment_yaml(ns, KEY_ONE, 2, 8, 2));
    assert!(r.ok, "tenant objects: {}", r.stderr);
}

fn environment(k: &Kubectl, ns: &str) -> Value {
    k.get(&["agentenvironment", "claude", "-n", ns])
        .expect("the environment")
}

fn ready_is(k: &Kubectl, ns: &str, want: &str) -> Value {
    wait_for(
        &format!("the environment's Ready condition to be {want}"),
        Duration::from_secs(90),
        || {
            let e = environment(k, ns);
            (e2e::condition(&e, "Ready").map(|c| c.0).as_deref() == Some(want)).then_some(e)
        },
    )
}

/// A session's posted results by script step.
fn by_step(record: &Value, session: &str) -> BTreeMap<String, Value> {
    record["results"][session]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["step"].as_str().unwrap_or_default().to_owned(), r.clone()))
        .collect()
}

fn walk(k: &Kubectl, standin: &StandIn, host: &str) {
    let ns = Namespace::create(k, TENANT, &[]);
    tenant(k, &ns.name);
    let env = ready_is(k, &ns.name, "True");
    assert_eq!(env["status"]["sessionsRunning"], 0, "{env}");
    differential(standin, &ns.name);
    skills_and_memory(standin);
    no_credential_no_route(k, standin, &ns.name, host);
    restart_runs_nothing_twice(k, standin, &ns.name);
    key_rotation(k, standin, &ns.name);
}

/// Steps whose results differ from the official worker's by design
/// (docs/DIVERGENCES.md, "Managed Agents dispatcher"), with what each
/// must show instead.
fn divergent(step: &str, ours: &Value) -> Option<String> {
    let t = text(ours);
    let ok = match step {
        // The plane's glob and grep report paths as the runner sees them
        // (/workspace/...); the official worker's are on its host.
        "s05-glob" => t.contains("/workspace/notes/hello.txt"),
        "s06-grep" => t.contains("hello.txt") && t.contains("edited line"),
        // The runner's own timeout and error wording, and the exit-code
        // trailer it appends.
        "s11-bash-timeout" => ours["is_error"] == true,
        "s14-bash-exit-1" => t.contains("failing") && t.contains("3"),
        "s15-read-missing" => ours["is_error"] == true && t.contains("notes/missing.txt"),
        // (write, edit, read and bash's restart answer word for word alike,
        // and are compared exactly.)
        // The runner truncates at its own cap and says so in its words.
        "s13-bash-200k" => t.contains("xxxxxxxx") && t.len() < 204_800,
        // A custom tool nobody here owns gets an error result rather than
        // being left pending (the issue asks for a clear error, not a hang).
        "s16-custom-unowned" => ours["is_error"] == true && t.contains("lookup_order"),
        _ => return None,
    };
    Some(if ok {
        String::new()
    } else {
        format!(
            "step {step}: the plane's result does not show what the divergence promises: {ours}"
        )
    })
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

fn differential(s: &StandIn, _ns: &str) {
    let official: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/managed/official-results.json"))
            .expect("official results"),
    )
    .expect("JSON");
    let official_session = official["results"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("a session in the official results");
    let theirs = by_step(&official, &official_session);
    let started = Instant::now();
    let items = s.enqueue(&script("script.json"), 1);
    let record = s.finished(&items, Duration::from_secs(240));
    eprintln!("scripted session finished in {:?}", started.elapsed());
    let ours = by_step(&record, &items[0].1);
    let steps: Vec<Value> = script("script.json")["steps"]
        .as_array()
        .expect("steps")
        .clone();
    let mut problems = Vec::new();
    for step in &steps {
        let id = step["id"].as_str().expect("step id");
        let (o, t) = (ours.get(id), theirs.get(id));
        if let Some(why) = o.and_then(|o| divergent(id, o)) {
            eprintln!(
                "divergent step {id}:\n  plane:    {:?}\n  official: {:?}",
                o.map(|o| short(&text(o))),
                t.map(|t| short(&text(t)))
            );
            if !why.is_empty() {
                problems.push(why);
            }
            continue;
        }
        match (o, t) {
            (None, None) => {}
            (Some(o), Some(t)) => {
                // The runner keeps bash's last newline, as the reference
                // (Go) toolset does; the Python worker strips it.
                let (ours_text, theirs_text) = (text(o), text(t));
                let same_text = ours_text == theirs_text
                    || (step["name"] == "bash"
                        && ours_text.strip_suffix('\n') == Some(theirs_text.as_str()));
                if o["is_error"] != t["is_error"] || !same_text {
                    problems.push(format!("step {id}: ours {o} / official {t}"));
                }
            }
            (o, t) => problems.push(format!("step {id}: ours {o:?} / official {t:?}")),
        }
        if let Some(o) = o {
            assert_eq!(o["count"], 1, "step {id} was answered more than once: {o}");
            // What both implementations must show, from the script.
            let expect = &step["expect"];
            if id != "s16-custom-unowned" {
                if let Some(e) = expect["is_error"].as_bool() {
                    assert_eq!(o["is_error"].as_bool(), Some(e), "step {id}: {o}");
                }
                for c in expect["contains"].as_array().into_iter().flatten() {
                    let c = c.as_str().unwrap_or_default();
                    assert!(text(o).contains(c), "step {id} lacks {c:?}: {o}");
                }
                assert!(
                    expect["no_result"] != true,
                    "step {id} must get no result: {o}"
                );
            }
        }
    }
    assert!(
        problems.is_empty(),
        "results differ:\n{}",
        problems.join("\n")
    );
    // The denied calls never ran: their side effect is absent (step s10
    // checks it in the sandbox and is compared above) and nothing was posted.
    for id in ["s08-ask-denied", "s09-server-denied"] {
        if steps.iter().any(|s| s["id"] == id) {
            assert!(
                !ours.contains_key(id),
                "{id} got a result: {:?}",
                ours.get(id)
            );
        }
    }
}

fn no_credential_no_route(k: &Kubectl, s: &StandIn, ns: &str, host: &str) {
    let port = s.url.rsplit(':').next().expect("port");
    let probe = json!({
        "id_prefix": "probe",
        // write is always_ask here: the call runs only once the person's
        // confirmation arrived, and the gateway demands the dispatcher's
        // approval for it.
        "agent": {"tools": [{"type": "agent_toolset_20260401",
            "configs": [{"name": "write", "permission_policy": {"type": "always_ask"}}]}]},
        "steps": [
            {"id": "asked", "type": "tool_use", "name": "write", "evaluated_permission": "ask",
             "evaluation": {"type": "always_ask"}, "confirm": {"result": "allow"},
             "input": {"file_path": "asked.txt", "content": "confirmed"}},
            {"id": "hold", "type": "tool_use", "name": "bash", "evaluated_permission": "allow",
             "input": {"command": "sleep 6; echo held"}},
            {"id": "env", "type": "tool_use", "name": "bash", "evaluated_permission": "allow",
             "input": {"command": format!("env; echo; timeout 20 grep -rIl -e '{KEY_ONE}' -e sessions_token / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; echo scanned")}},
            {"id": "route", "type": "tool_use", "name": "bash", "evaluated_permission": "allow",
             "input": {"command": format!("timeout 5 bash -c 'exec 3<>/dev/tcp/{host}/{port} && echo REACHED' 2>&1; echo rc=$?")}},
        ]
    });
    let items = s.enqueue(&probe, 1);
    // While the first call holds the session, look at its pod.
    let pod = wait_for("the probe session's pod", Duration::from_secs(60), || {
        let list = k.get(&["agentsessions", "-n", ns])?;
        list["items"].as_array()?.iter().find_map(|x| {
            (x["metadata"]["annotations"]["agentplane.dev/claude-session-id"] == items[0].1)
                .then(|| x["status"]["podName"].as_str().map(str::to_owned))
                .flatten()
        })
    });
    let p = k.get(&["pod", &pod, "-n", ns]).expect("the sandbox pod");
    let spec = p["spec"].to_string();
    assert!(
        !spec.contains("claude-env"),
        "the key's Secret reaches the sandbox pod: {spec}"
    );
    assert!(
        !spec.to_lowercase().contains("anthropic"),
        "an Anthropic setting reaches the sandbox pod: {spec}"
    );
    assert!(!spec.contains(KEY_ONE), "the key is in the pod spec");
    let record = s.finished(&items, Duration::from_secs(120));
    let r = by_step(&record, &items[0].1);
    let env = text(&r["env"]);
    assert!(env.contains("scanned"), "{env}");
    assert!(
        !env.to_lowercase().contains("anthropic"),
        "an ANTHROPIC_* variable or file in the sandbox:\n{env}"
    );
    assert!(
        !env.contains(KEY_ONE) && !env.contains("sessions_token"),
        "a credential in the sandbox:\n{env}"
    );
    assert_eq!(
        r["asked"]["is_error"], false,
        "the confirmed always_ask call: {}",
        r["asked"]
    );
    let route = text(&r["route"]);
    assert!(
        !route.contains("REACHED") && route.contains("rc="),
        "the sandbox reached the API stand-in: {route}"
    );
}

fn restart_runs_nothing_twice(k: &Kubectl, s: &StandIn, ns: &str) {
    let steps: Vec<Value> = (1..=4)
        .map(|i| {
            json!({"id": format!("c{i}"), "type": "tool_use", "name": "bash", "evaluated_permission": "allow",
                   "input": {"command": format!("echo run-{i} >> runs.txt; sleep 3; echo done-{i}")}})
        })
        .chain(std::iter::once(json!({"id": "count", "type": "tool_use", "name": "bash",
            "evaluated_permission": "allow", "input": {"command": "cat runs.txt"}})))
        .collect();
    let items = s.enqueue(&json!({"id_prefix": "restart", "agent": {"tools": [{"type": "agent_toolset_20260401"}]}, "steps": steps}), 1);
    // Kill the dispatcher while the second call runs.
    wait_for("the first call's result", Duration::from_secs(90), || {
        let r = s.record();
        r["results"][&items[0].1]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(1000));
    let r = k.run(
        &[
            "-n",
            RELEASE_NS,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=agentplane-dispatcher",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    assert!(r.ok, "kill the dispatcher: {}", r.stderr);
    let record = s.finished(&items, Duration::from_secs(180));
    let results = by_step(&record, &items[0].1);
    for (step, r) in &results {
        assert_eq!(r["count"], 1, "step {step} was posted {} times", r["count"]);
    }
    assert_eq!(
        text(&results["count"]).trim(),
        "run-1\nrun-2\nrun-3\nrun-4",
        "every call ran exactly once"
    );
    let _ = ns;
}

fn key_rotation(k: &Kubectl, s: &StandIn, ns: &str) {
    s.set_keys(&[KEY_TWO]);
    let e = ready_is(k, ns, "False");
    let err = e["status"]["lastPollError"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(err.contains("401"), "{e}");
    assert!(
        !err.contains(KEY_ONE) && !err.contains(KEY_TWO),
        "a key in the status: {err}"
    );
    let before = s.record()["requests"].as_array().map(Vec::len).unwrap_or(0);
    let r = k.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: claude-env, namespace: {ns}}}\nstringData: {{key: {KEY_TWO}}}\n"
    ));
    assert!(r.ok, "rotate: {}", r.stderr);
    ready_is(k, ns, "True");
    let record = s.record();
    let polled_with_new = record["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .skip(before.saturating_sub(1))
        .any(|q| {
            q["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/work/poll"))
                && q["credential"] == "env_key:0"
                && q["status"] == 200
        });
    assert!(polled_with_new, "no poll with the rotated key was accepted");
    // And sessions run with it.
    let items = s.enqueue(
        &json!({"id_prefix": "rotated", "agent": {"tools": [{"type": "agent_toolset_20260401"}]},
                "steps": [{"id": "one", "type": "tool_use", "name": "bash", "evaluated_permission": "allow", "input": {"command": "echo rotated"}}]}),
        1,
    );
    let record = s.finished(&items, Duration::from_secs(120));
    assert_eq!(
        text(&by_step(&record, &items[0].1)["one"]).trim(),
        "rotated"
    );
}

/// The agent's skill and the session's memory store are put into the
/// sandbox before its calls run, and what the agent changed in the store
/// is synced back with the item's own token.
fn skills_and_memory(s: &StandIn) {
    let items = s.enqueue(&script("script-extras.json"), 1);
    let record = s.finished(&items, Duration::from_secs(180));
    let r = by_step(&record, &items[0].1);
    for step in script("script-extras.json")["steps"]
        .as_array()
        .expect("steps")
    {
        let id = step["id"].as_str().expect("id");
        let o = r
            .get(id)
            .unwrap_or_else(|| panic!("step {id} got no result: {record}"));
        assert_eq!(o["is_error"], false, "step {id}: {o}");
        for c in step["expect"]["contains"].as_array().into_iter().flatten() {
            let c = c.as_str().unwrap_or_default();
            assert!(text(o).contains(c), "step {id} lacks {c:?}: {o}");
        }
    }
    let work = &items[0].0;
    let synced: Vec<(String, String, String)> = record["memory_synced"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["op"].as_str().unwrap_or_default().to_owned(),
                m["path"].as_str().unwrap_or_default().to_owned(),
                m["credential"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let token = format!("sessions_token:{work}");
    assert!(
        synced.contains(&("create".into(), "/learned.md".into(), token.clone())),
        "{synced:?}"
    );
    assert!(
        synced.contains(&("update".into(), "/preferences.md".into(), token)),
        "{synced:?}"
    );
    assert_eq!(
        synced.len(),
        2,
        "only the agent's changes are synced: {synced:?}"
    );
    let store = &record["memory_stores"]["memstore_standin_notes"];
    assert_eq!(store["/learned.md"], "the user likes tea\n", "{store}");
    assert_eq!(store["/preferences.md"], "colour: green\n", "{store}");
}
