//! The dispatcher's client of the Managed Agents API against the stand-in
//! (tests/managed/standin.py, a real HTTP server the official
//! `EnvironmentWorker` is checked against): poll, ack, the lease and its
//! loss, a session's events, a posted result, stop, faults and keys. No
//! cluster: the parts that need one run in tests/e2e/tests/managed.rs.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dispatcher::api::ManagedApi;
use dispatcher::lease::{Lease, LeaseEnd, LeaseState, Target};
use dispatcher::ledger::Ledger;
use serde_json::{Value, json};

const KEY: &str = "sk-env-test-key";

struct StandIn {
    child: Child,
    url: String,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> String {
    if let Ok(p) = std::env::var("AGENTPLANE_PYTHON") {
        return p;
    }
    let out = Command::new(root().join("scripts/python-env.sh"))
        .output()
        .expect("scripts/python-env.sh");
    String::from_utf8(out.stdout)
        .expect("path")
        .trim()
        .to_owned()
}

fn start(lease_ttl: u32) -> StandIn {
    let mut child = Command::new("prlimit")
        .args(["--as=2000000000", "--"])
        .arg(python())
        .arg(root().join("tests/managed/standin.py"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--key",
            KEY,
            "--lease-ttl",
            &lease_ttl.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the stand-in");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("LISTENING line");
    let url = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("the stand-in said {line:?}"))
        .to_owned();
    StandIn { child, url }
}

async fn control(s: &StandIn, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let c = reqwest::Client::new();
    let mut r = c.request(method, format!("{}{path}", s.url));
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.expect("control").json().await.expect("json")
}

fn session_script() -> Value {
    json!({"id_prefix": "proto", "agent": {"tools": [{"type": "agent_toolset_20260401"}]},
           "steps": [{"id": "one", "type": "tool_use", "name": "bash", "evaluated_permission": "allow",
                      "input": {"command": "echo hi"}}]})
}

async fn lease_state(l: &Lease, want: impl Fn(&LeaseState) -> bool) -> LeaseState {
    for _ in 0..200 {
        let s = l.state();
        if want(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    l.state()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_queue_round_trip_and_its_failures() {
    let s = start(4);
    let api = ManagedApi::new(&s.url).expect("client");

    // A wrong key is refused for good, with the API's words and no key.
    let e = api
        .poll("env_standin", "not-the-key", "w")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert!(!e.is_transient());
    assert!(
        e.to_string().contains("authentication_error") && !e.to_string().contains("not-the-key"),
        "{e}"
    );

    // An empty queue is no work.
    assert!(
        api.poll("env_standin", KEY, "w")
            .await
            .expect("poll")
            .is_none()
    );

    // Faults come back as transient errors.
    control(
        &s,
        reqwest::Method::POST,
        "/_standin/faults",
        Some(json!({"poll": [503, 429]})),
    )
    .await;
    for want in [503, 429] {
        let e = api.poll("env_standin", KEY, "w").await.unwrap_err();
        assert_eq!(e.status(), Some(want));
        assert!(e.is_transient(), "{e}");
    }

    // An item: its session and token.
    let q = control(
        &s,
        reqwest::Method::POST,
        "/_standin/enqueue",
        Some(json!({"session": session_script()})),
    )
    .await;
    let session = q["items"][0]["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    let item = api
        .poll("env_standin", KEY, "w")
        .await
        .expect("poll")
        .expect("an item");
    assert_eq!(item.session_id.as_deref(), Some(session.as_str()));
    assert_eq!(item.kind, "session");
    let token: Arc<str> = Arc::from(
        item.sessions_token
            .clone()
            .expect("a sessions token")
            .as_str(),
    );
    api.ack("env_standin", KEY, &item.id).await.expect("ack");

    // The lease: held with the server's TTL.
    let target = Target {
        api: api.clone(),
        environment: "env_standin".into(),
        work: item.id.clone(),
        bearer: token.clone(),
    };
    let lease = Lease::start(target.clone(), false);
    let st = lease_state(
        &lease,
        |s| matches!(s, LeaseState::Held(t) if *t == Duration::from_secs(4)),
    )
    .await;
    assert_eq!(st, LeaseState::Held(Duration::from_secs(4)));

    // Another worker without proof of ownership loses at once (412)...
    let other = Lease::start(target.clone(), false);
    let end = tokio::time::timeout(Duration::from_secs(10), other.ended())
        .await
        .expect("ends");
    assert!(matches!(end, LeaseEnd::Lost(_)), "{end:?}");
    assert!(!other.may_stop());
    // ...while a restarted dispatcher that owns the run adopts it, and the
    // old holder then finds its lease lost on its next beat.
    let adopted = Lease::start(target.clone(), true);
    let st = lease_state(
        &adopted,
        |s| matches!(s, LeaseState::Held(t) if *t == Duration::from_secs(4)),
    )
    .await;
    assert_eq!(st, LeaseState::Held(Duration::from_secs(4)));
    let end = tokio::time::timeout(Duration::from_secs(15), lease.ended())
        .await
        .expect("the old lease ends");
    assert!(matches!(end, LeaseEnd::Lost(_)), "{end:?}");

    // The session's events: stream first, then the history; the call is
    // seen once however many times it arrives.
    let mut stream = api.stream(&token, &session).await.expect("stream");
    let mut ledger = Ledger::new();
    let (events, _) = api
        .events_page(&token, &session, None)
        .await
        .expect("history");
    for e in &events {
        ledger.observe(e);
    }
    let call = loop {
        if let Some(c) = ledger.next_runnable() {
            break c;
        }
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open");
        ledger.observe(&ev);
    };
    assert_eq!(call.name, "bash");
    let result = dispatcher::item::result_event(
        &call,
        &dispatcher::tools::Outcome {
            content: "hi\n".into(),
            is_error: false,
        },
    );
    api.send_events(&token, &session, &[result])
        .await
        .expect("post");
    ledger.posted(&call.id);
    assert!(ledger.next_runnable().is_none());

    let rec = control(&s, reqwest::Method::GET, "/_standin/record", None).await;
    let posted = &rec["results"][&session][0];
    assert_eq!(posted["tool_use_id"], call.id.as_str());
    assert_eq!(posted["count"], 1);
    assert_eq!(posted["content"][0]["text"], "hi\n");

    // Stop, and stop again (already stopped is fine).
    api.stop("env_standin", &token, &item.id, true)
        .await
        .expect("stop");
    api.stop("env_standin", &token, &item.id, true)
        .await
        .expect("stop again");
    let end = tokio::time::timeout(Duration::from_secs(15), adopted.ended())
        .await
        .expect("ends");
    assert_eq!(end, LeaseEnd::StopRequested);

    // The queue's figures.
    let stats = api.stats("env_standin", KEY).await.expect("stats");
    assert_eq!(stats.depth, Some(0));

    // A rotated key: the old one refused, the new one taken.
    control(
        &s,
        reqwest::Method::PUT,
        "/_standin/keys",
        Some(json!({"keys": ["sk-env-rotated"]})),
    )
    .await;
    assert_eq!(
        api.poll("env_standin", KEY, "w")
            .await
            .unwrap_err()
            .status(),
        Some(401)
    );
    assert!(api.poll("env_standin", "sk-env-rotated", "w").await.is_ok());
}

/// Runs the dispatcher's own calls on this host, as the runner would in
/// the sandbox: `bash` under `bash -c` (its failures end with `exit code:
/// N`), `write` into the workdir. Records every call.
struct LocalTools {
    workdir: PathBuf,
    calls: std::sync::Mutex<Vec<(String, String, bool)>>,
}

impl dispatcher::files::Tools for LocalTools {
    fn call(
        &self,
        _namespace: &str,
        _session: &str,
        call: &dispatcher::ledger::ToolCall,
        approve: bool,
        _resume: bool,
    ) -> impl std::future::Future<Output = dispatcher::tools::Outcome> + Send {
        self.calls
            .lock()
            .unwrap()
            .push((call.id.clone(), call.name.clone(), approve));
        let out = match call.name.as_str() {
            "bash" => {
                let o = Command::new("bash")
                    .arg("-c")
                    .arg(call.input["command"].as_str().unwrap())
                    .current_dir(&self.workdir)
                    .output()
                    .expect("bash");
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                if !o.status.success() {
                    text.push_str(&format!("exit code: {}", o.status.code().unwrap_or(-1)));
                }
                dispatcher::tools::Outcome {
                    content: text,
                    is_error: !o.status.success(),
                }
            }
            "write" => {
                let p = self.workdir.join(call.input["file_path"].as_str().unwrap());
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, call.input["content"].as_str().unwrap()).unwrap();
                dispatcher::tools::Outcome {
                    content: "ok".into(),
                    is_error: false,
                }
            }
            other => panic!("unexpected tool {other}"),
        };
        std::future::ready(out)
    }
}

fn extras() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/managed/script-extras.json")).unwrap(),
    )
    .unwrap()
}

fn temp_workdir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "dispatcher-{tag}-{}-{}",
        std::process::id(),
        fastrand_suffix()
    ));
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn fastrand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Polls and acks the one queued item; its session's info and token.
async fn take(api: &ManagedApi) -> (dispatcher::api::WorkItem, String) {
    let item = api
        .poll("env_standin", KEY, "w")
        .await
        .expect("poll")
        .expect("an item");
    api.ack("env_standin", KEY, &item.id).await.expect("ack");
    let token = item.sessions_token.clone().expect("a sessions token");
    (item, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_and_memory_go_into_the_sandbox_and_memory_comes_back() {
    let s = start(30);
    let api = ManagedApi::new(&s.url).expect("client");
    control(
        &s,
        reqwest::Method::POST,
        "/_standin/enqueue",
        Some(json!({"session": extras()})),
    )
    .await;
    let (item, token) = take(&api).await;
    let info = api
        .session(&token, item.session_id.as_deref().unwrap())
        .await
        .expect("session");
    assert_eq!(info.skills.len(), 1);
    let refs = dispatcher::memory::stores(&info.resources);
    assert_eq!(refs.len(), 1);

    // The API calls on their own: a version resolved from `latest`, its
    // archive unpacked; the store listed with content.
    let v = api
        .skill_version(&token, "skill_standin_hello", "latest")
        .await
        .expect("version");
    assert_eq!(v.id, "1759276800000000");
    assert_eq!(v.name, "hello-skill");
    let archive = api
        .skill_content(
            &token,
            "skill_standin_hello",
            &v.id,
            dispatcher::skills::MAX_ARCHIVE,
        )
        .await
        .expect("content");
    let u = dispatcher::skills::unpack(&archive).expect("unpack");
    let paths: Vec<&str> = u.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, vec!["SKILL.md", "scripts/hi.sh"]);
    // A capped download is refused while it is read.
    assert!(
        api.skill_content(&token, "skill_standin_hello", &v.id, 10)
            .await
            .is_err()
    );
    let (mems, next) = api
        .memories_page(&token, "memstore_standin_notes", None)
        .await
        .expect("list");
    assert_eq!(next, None);
    assert_eq!(mems.len(), 1);
    assert_eq!(mems[0].path, "/preferences.md");
    assert_eq!(mems[0].content.as_deref(), Some("colour: blue\n"));
    // The environment key is refused there, as by the real API.
    assert_eq!(
        api.memories_page(KEY, "memstore_standin_notes", None)
            .await
            .unwrap_err()
            .status(),
        Some(401)
    );

    // Through the dispatcher's own calls, into a "sandbox" on this host.
    let wd = temp_workdir("extras");
    let tools = LocalTools {
        workdir: wd.clone(),
        calls: Default::default(),
    };
    let policies: std::collections::BTreeMap<String, String> = [
        ("bash", "always_ask"),
        ("write", "always_allow"),
        ("read", "always_allow"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    let sb = dispatcher::files::Sandbox::new("ns", "ma-x", wd.to_str().unwrap(), policies);
    let done = dispatcher::skills::install(&api, &tools, &sb, &token, &item.id, &info.skills).await;
    assert_eq!(done, vec!["skills/hello-skill"]);
    let skill = wd.join("skills/hello-skill");
    assert_eq!(
        std::fs::read_to_string(skill.join("SKILL.md")).unwrap(),
        "---\nname: hello-skill\n---\nhello skill body\n"
    );
    assert_eq!(
        std::fs::read_to_string(skill.join("scripts/hi.sh")).unwrap(),
        "echo hi from skill\n"
    );
    assert!(!wd.join("skills/.hello-skill.partial").exists());
    let mounted =
        dispatcher::memory::mount(&api, &tools, &sb, &token, &item.id, &refs, "memory").await;
    assert_eq!(mounted.len(), 1);
    assert_eq!(mounted[0].dir, "memory/notes");
    let store = wd.join("memory/notes");
    assert_eq!(
        std::fs::read_to_string(store.join("preferences.md")).unwrap(),
        "colour: blue\n"
    );
    assert_eq!(
        std::fs::read_to_string(store.join(".anthropic-memory-store")).unwrap(),
        "version 1\nmemstore_standin_notes"
    );
    // A second mount over a directory that is not empty is refused.
    let again =
        dispatcher::memory::mount(&api, &tools, &sb, &token, &item.id, &refs, "memory").await;
    assert!(again.is_empty());

    // The agent's run: a new memory, an edited one, a large one, a
    // deleted skill file (nothing to do with memory).
    std::fs::write(store.join("learned.md"), "the user likes tea\n").unwrap();
    std::fs::write(store.join("preferences.md"), "colour: green\n").unwrap();
    let big: String = "x".repeat(150_000);
    std::fs::create_dir_all(store.join("deep/er")).unwrap();
    std::fs::write(store.join("deep/er/big.md"), &big).unwrap();
    dispatcher::memory::sync(&api, &tools, &sb, &token, &item.id, &mounted).await;

    let rec = control(&s, reqwest::Method::GET, "/_standin/record", None).await;
    let synced: Vec<(String, String)> = rec["memory_synced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["op"].as_str().unwrap().to_owned(),
                e["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        synced,
        vec![
            ("create".to_owned(), "/deep/er/big.md".to_owned()),
            ("create".to_owned(), "/learned.md".to_owned()),
            ("update".to_owned(), "/preferences.md".to_owned()),
        ]
    );
    let now = &rec["memory_stores"]["memstore_standin_notes"];
    assert_eq!(now["/preferences.md"], "colour: green\n");
    assert_eq!(now["/learned.md"], "the user likes tea\n");
    assert_eq!(now["/deep/er/big.md"].as_str().unwrap().len(), 150_000);
    // The marker is never synced.
    assert!(now.get("/.anthropic-memory-store").is_none());
    // Skill calls carry no beta; memory calls the memory beta and the
    // sessions token.
    for r in rec["requests"].as_array().unwrap() {
        let path = r["path"].as_str().unwrap();
        if path.starts_with("/v1/skills/") {
            assert_eq!(r["beta"], Value::Null, "{r}");
        }
        if path.starts_with("/v1/memory_stores/") && r["status"] == 200 {
            assert_eq!(r["beta"], "agent-memory-2026-07-22", "{r}");
            assert_eq!(
                r["credential"],
                format!("sessions_token:{}", item.id),
                "{r}"
            );
        }
    }
    // Every internal call has the dispatcher's id and asked for an
    // approval where the session's policy is always_ask.
    let calls = tools.calls.lock().unwrap().clone();
    assert!(!calls.is_empty());
    for (id, name, approve) in &calls {
        assert!(id.starts_with("dispatcher-"), "{id}");
        assert_eq!(*approve, name == "bash", "{id} {name}");
    }

    // Update with a precondition on a stale SHA: 409, the store's version kept.
    let (mems, _) = api
        .memories_page(&token, "memstore_standin_notes", None)
        .await
        .expect("list");
    let pref = mems.iter().find(|m| m.path == "/preferences.md").unwrap();
    let e = api
        .memory_update(
            &token,
            "memstore_standin_notes",
            &pref.id,
            "colour: red\n",
            &"0".repeat(64),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    let m = api
        .memory_update(
            &token,
            "memstore_standin_notes",
            &pref.id,
            "colour: red\n",
            &pref.content_sha256,
        )
        .await
        .expect("update");
    assert_eq!(m.path, "/preferences.md");
    std::fs::remove_dir_all(&wd).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bash_text_files_go_in_through_write_and_nothing_comes_back() {
    let s = start(30);
    let api = ManagedApi::new(&s.url).expect("client");
    let mut script = extras();
    script["id_prefix"] = json!("nobash");
    control(
        &s,
        reqwest::Method::POST,
        "/_standin/enqueue",
        Some(json!({"session": script})),
    )
    .await;
    let (item, token) = take(&api).await;
    let info = api
        .session(&token, item.session_id.as_deref().unwrap())
        .await
        .expect("session");
    let wd = temp_workdir("nobash");
    let tools = LocalTools {
        workdir: wd.clone(),
        calls: Default::default(),
    };
    let policies = [("write".to_owned(), "always_allow".to_owned())].into();
    let sb = dispatcher::files::Sandbox::new("ns", "ma-y", wd.to_str().unwrap(), policies);
    let done = dispatcher::skills::install(&api, &tools, &sb, &token, &item.id, &info.skills).await;
    assert_eq!(done, vec!["skills/hello-skill"]);
    assert!(wd.join("skills/hello-skill/SKILL.md").is_file());
    // A binary file cannot go through write: skipped, and said so.
    let skipped = sb
        .put(
            &tools,
            "test",
            "bin",
            &[dispatcher::files::PutFile {
                path: "blob".into(),
                data: vec![0xff, 0xfe, 0],
                executable: false,
            }],
        )
        .await
        .expect("put");
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].contains("binary"), "{skipped:?}");
    assert!(!wd.join("bin/blob").exists());
    let refs = dispatcher::memory::stores(&info.resources);
    let mounted =
        dispatcher::memory::mount(&api, &tools, &sb, &token, &item.id, &refs, "memory").await;
    assert_eq!(mounted.len(), 1);
    assert!(wd.join("memory/notes/preferences.md").is_file());
    std::fs::write(wd.join("memory/notes/new.md"), "x").unwrap();
    dispatcher::memory::sync(&api, &tools, &sb, &token, &item.id, &mounted).await;
    let rec = control(&s, reqwest::Method::GET, "/_standin/record", None).await;
    assert_eq!(rec["memory_synced"], json!([]));
    let calls = tools.calls.lock().unwrap().clone();
    assert!(
        calls.iter().all(|(_, n, a)| n == "write" && !a),
        "{calls:?}"
    );
    std::fs::remove_dir_all(&wd).unwrap();
}
