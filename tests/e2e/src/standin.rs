//! The Managed Agents stand-in (`tests/managed/standin.py`) as a child
//! process: started on the node's address so the dispatcher's pod reaches
//! it, driven through its `/_standin/` control routes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::root;

/// A running stand-in.
#[derive(Debug)]
pub struct StandIn {
    child: Child,
    /// `http://HOST:PORT`, as pods reach it.
    pub url: String,
    /// The log file (its stderr).
    pub log: std::path::PathBuf,
    http: reqwest::blocking::Client,
}

impl StandIn {
    /// Starts the stand-in listening on `host` (all ports free), accepting
    /// `keys`, its leases lasting `lease_ttl` seconds; bounded to 2 GB of
    /// address space.
    pub fn start(host: &str, keys: &[&str], lease_ttl: u32) -> Self {
        let python = std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| "python3".into());
        let log = std::env::temp_dir().join(format!("standin-{}.log", std::process::id()));
        let mut cmd = Command::new("prlimit");
        cmd.args(["--as=2000000000", "--"])
            .arg(python)
            .arg(root().join("tests/managed/standin.py"))
            .args(["--listen", &format!("{host}:0")])
            .args(["--lease-ttl", &lease_ttl.to_string()]);
        for k in keys {
            cmd.args(["--key", k]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("stand-in log"))
            .spawn()
            .expect("start the stand-in");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .expect("the stand-in says where it listens");
        let url = line
            .trim()
            .strip_prefix("LISTENING ")
            .unwrap_or_else(|| panic!("the stand-in said {line:?}; log: {}", log.display()))
            .to_owned();
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        Self {
            child,
            url,
            log,
            http,
        }
    }

    /// Queues `count` sessions of `script`; their (work id, session id).
    pub fn enqueue(&self, script: &Value, count: usize) -> Vec<(String, String)> {
        let r: Value = self
            .http
            .post(format!("{}/_standin/enqueue", self.url))
            .json(&json!({"session": script, "count": count}))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.json())
            .expect("enqueue");
        r["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| {
                (
                    i["work_id"].as_str().expect("work_id").to_owned(),
                    i["session_id"].as_str().expect("session_id").to_owned(),
                )
            })
            .collect()
    }

    /// Everything the stand-in recorded.
    pub fn record(&self) -> Value {
        self.http
            .get(format!("{}/_standin/record", self.url))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.json())
            .expect("record")
    }

    /// Replaces the accepted environment keys.
    pub fn set_keys(&self, keys: &[&str]) {
        self.http
            .put(format!("{}/_standin/keys", self.url))
            .json(&json!({"keys": keys}))
            .send()
            .and_then(|r| r.error_for_status())
            .expect("set keys");
    }

    /// The last lines of its log, then the last requests it answered
    /// (method, path, status, credential) and each session's progress: what
    /// a reader of a failed run needs to see where the dispatcher stopped.
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        let mut out = lines[lines.len().saturating_sub(40)..].join("\n");
        if let Ok(r) = self
            .http
            .get(format!("{}/_standin/record", self.url))
            .send()
            .and_then(|r| r.json::<Value>())
        {
            let reqs = r["requests"].as_array().cloned().unwrap_or_default();
            out.push_str("\nlast requests:\n");
            for q in &reqs[reqs.len().saturating_sub(60)..] {
                out.push_str(&format!(
                    "  {:.3} {} {} -> {} ({})\n",
                    q["t"].as_f64().unwrap_or_default(),
                    q["method"].as_str().unwrap_or_default(),
                    q["path"].as_str().unwrap_or_default(),
                    q["status"],
                    q["credential"].as_str().unwrap_or_default()
                ));
            }
            out.push_str(&format!(
                "sessions: {}\nwork: {}\n",
                r["sessions"], r["work"]
            ));
        }
        out
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StandIn {
    /// Waits until every (work id, session id) is done and its work item
    /// stopped; the record then.
    pub fn finished(&self, items: &[(String, String)], limit: Duration) -> Value {
        crate::wait_for("the sessions to finish", limit, || {
            let r = self.record();
            items
                .iter()
                .all(|(w, id)| {
                    r["sessions"][id]["done"] == true && r["work"][w]["state"] == "stopped"
                })
                .then_some(r)
        })
    }
}

/// The Secret holding `key`, a warm pool `claude` of `pool` pods and the
/// `AgentEnvironment` `claude` serving the stand-in's `env_standin` from
/// it, in `ns`.
pub fn environment_yaml(
    ns: &str,
    key: &str,
    pool: usize,
    concurrent: usize,
    idle_seconds: u32,
) -> String {
    let image = crate::sandbox_image();
    format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{name: claude-env, namespace: {ns}}}
stringData: {{key: {key}}}
---
apiVersion: agentplane.dev/v1alpha1
kind: AgentWarmPool
metadata: {{name: claude, namespace: {ns}}}
spec:
  replicas: {pool}
  template: {{image: {image}, workdir: /workspace}}
---
apiVersion: agentplane.dev/v1alpha1
kind: AgentEnvironment
metadata: {{name: claude, namespace: {ns}}}
spec:
  environmentId: env_standin
  keySecretRef: {{name: claude-env}}
  sandbox:
    warmPool: claude
    template: {{image: {image}, workdir: /workspace}}
  maxConcurrentSessions: {concurrent}
  idleSeconds: {idle_seconds}
"#
    )
}

/// A script from `tests/managed/`.
pub fn script(name: &str) -> Value {
    let p = root().join("tests/managed").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("script")).expect("script JSON")
}

/// The text of a posted result's content blocks, joined.
pub fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}
