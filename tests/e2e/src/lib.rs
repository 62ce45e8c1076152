//! Helpers for tests that run against the real single-node cluster the
//! harness in `tests/cluster` starts: `kubectl` as a user runs it, the
//! operator as a process, a CA and webhook registration made per run.
//!
//! Nothing here mocks the cluster. Without one the tests fail and say how
//! to get one (`scripts/test-all.sh` starts it). `tests/follow.rs` is the
//! exception: it needs only the built binaries.

pub mod api;
pub mod front;
pub mod release;
pub mod scale;
pub mod standin;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("../.."))
}

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: these tests need the real cluster; run scripts/test-all.sh, or tests/cluster/cluster.sh up and export KUBECONFIG and KUBECTL")
    })
}

/// The sandbox image the tests' sessions run (the harness's base image:
/// bash, GNU grep, coreutils).
pub fn sandbox_image() -> String {
    std::env::var("AGENTPLANE_SANDBOX_IMAGE")
        .unwrap_or_else(|_| "localhost/agentplane/sandbox-base:dev".into())
}

/// The runner image `scripts/images.sh` builds.
pub fn runner_image() -> String {
    std::env::var("AGENTPLANE_RUNNER_IMAGE")
        .unwrap_or_else(|_| "localhost/agentplane/runner:dev".into())
}

/// The `kubectl-agent` binary `cargo build -p kubectl-agent` made.
pub fn plugin_bin() -> PathBuf {
    built_bin("kubectl-agent", "kubectl-agent")
}

/// The `agent-sidecar` binary `cargo build -p sidecar` made (the e2e crate
/// cannot depend on the sidecar crate for it: a binary of another package
/// is only built when asked for).
pub fn runner_bin() -> PathBuf {
    built_bin("agent-sidecar", "sidecar")
}

fn built_bin(name: &str, package: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
    let p = target.join("debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: cargo build -p {package}",
        p.display()
    );
    p
}

/// Applies the CRDs as the chart ships them and waits until they are served.
pub fn install_crd(k: &Kubectl) {
    let dir = root().join("charts/agentplane/crds");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("the chart's crds directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    for file in &files {
        let crd = dir.join(file);
        k.must(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd.to_string_lossy(),
        ]);
        let name = format!("crd/{}", file.trim_end_matches(".yaml"));
        k.must(&[
            "wait",
            "--for=condition=Established",
            &name,
            "--timeout=60s",
        ]);
    }
}

/// A command's outcome, as text.
#[derive(Debug, Clone)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Self {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// kubectl against the harness cluster.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub bin: String,
    pub kubeconfig: String,
}

impl Kubectl {
    /// From `KUBECTL` and `KUBECONFIG`.
    pub fn from_env() -> Self {
        Self {
            bin: std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()),
            kubeconfig: required_env("KUBECONFIG"),
        }
    }

    /// Runs kubectl with `args`, feeding `stdin` when given.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin));
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .expect("write kubectl stdin");
        }
        child.wait_with_output().expect("kubectl finishes").into()
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Run {
        self.run(&["apply", "-f", "-"], Some(yaml))
    }

    /// An object as JSON, or `None` when it does not exist.
    pub fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let r = self.run(&all, None);
        if !r.ok {
            return None;
        }
        serde_json::from_str(&r.stdout).ok()
    }

    /// Runs and insists on success.
    pub fn must(&self, args: &[&str]) -> String {
        let r = self.run(args, None);
        assert!(r.ok, "kubectl {} failed: {}", args.join(" "), r.stderr);
        r.stdout
    }
}

/// Polls `f` every 250 ms until it yields, or fails naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A CA and a serving certificate for 127.0.0.1, written to a temp dir.
#[derive(Debug)]
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    pub fn generate() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "agentplane e2e CA");
        let ca_key = KeyPair::generate().expect("ca key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
        params
            .distinguished_name
            .push(DnType::CommonName, "agentplane-webhook");
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &issuer).expect("signed");
        let dir = tempfile::tempdir().expect("tempdir");
        let cert_path = dir.path().join("tls.crt");
        let key_path = dir.path().join("tls.key");
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Self {
            dir,
            ca_pem: ca_cert.pem(),
            cert: cert_path,
            key: key_path,
        }
    }
}

/// The operator, run as a process; killed when dropped.
#[derive(Debug)]
pub struct Operator {
    child: Child,
    pub health_port: u16,
    pub log: PathBuf,
}

/// The `agent-operator` binary `cargo build -p operator` made.
pub fn operator_bin() -> PathBuf {
    if let Ok(p) = std::env::var("AGENTPLANE_OPERATOR_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
    target.join("debug/agent-operator")
}

impl Operator {
    /// Starts the operator with the webhook on `webhook_port` and waits
    /// until /readyz answers.
    pub fn start(
        kubeconfig: &str,
        certs: &Certs,
        webhook_port: u16,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        Self::start_with_env(kubeconfig, certs, webhook_port, log, extra, &[])
    }

    /// As [`Operator::start`], with `env` added to the process environment.
    pub fn start_with_env(
        kubeconfig: &str,
        certs: &Certs,
        webhook_port: u16,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let bin = operator_bin();
        assert!(
            bin.exists(),
            "{} is missing: run cargo build -p operator first",
            bin.display()
        );
        let health_port = free_port();
        let logfile = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = Command::new(&bin)
            .arg("run")
            // The tests' MCP servers listen on loopback.
            .arg("--mcp-allow-cidr=127.0.0.0/8")
            .args(["--webhook-addr", &format!("127.0.0.1:{webhook_port}")])
            .args(["--health-addr", &format!("127.0.0.1:{health_port}")])
            .arg("--tls-cert")
            .arg(&certs.cert)
            .arg("--tls-key")
            .arg(&certs.key)
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,operator=debug")
            .envs(env.iter().copied())
            .stdout(logfile.try_clone().expect("log"))
            .stderr(logfile)
            .spawn()
            .expect("operator starts");
        let op = Self {
            child,
            health_port,
            log: log.to_owned(),
        };
        wait_for("the operator's /readyz", Duration::from_secs(30), || {
            op.ready().then_some(())
        });
        op
    }

    /// Whether /readyz answers 200.
    pub fn ready(&self) -> bool {
        http_get(self.health_port, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    }

    /// The process id (for /proc figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it at once, as a node failure would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bare HTTP/1.1 GET on loopback; the raw response.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Registers the validating webhook for AgentSessions at
/// `https://127.0.0.1:{port}/validate`, trusting `ca_pem`.
pub fn register_webhook(k: &Kubectl, name: &str, ca_pem: &str, port: u16) -> Run {
    let ca = base64(ca_pem.as_bytes());
    let yaml = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {name}
webhooks:
  - name: agentsessions.agentplane.dev
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig:
      url: https://127.0.0.1:{port}/validate
      caBundle: {ca}
    rules:
      - apiGroups: ["agentplane.dev"]
        apiVersions: ["v1alpha1"]
        resources: ["agentsessions"]
        operations: ["CREATE", "UPDATE"]
"#
    );
    k.apply(&yaml)
}

/// The objects of `kind` in `ns` labelled for `session` (the operator's
/// `agentplane.dev/session` label).
pub fn session_objects(k: &Kubectl, kind: &str, ns: &str, session: &str) -> Vec<Value> {
    k.get(&[
        kind,
        "-n",
        ns,
        "-l",
        &format!("agentplane.dev/session={session}"),
    ])
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default()
}

/// Removes the webhook registration `name`, if there is one: a test's last
/// step, since a registration whose server is gone refuses every session
/// write (failurePolicy Fail).
pub fn unregister_webhook(k: &Kubectl, name: &str) {
    let _ = k.run(
        &[
            "delete",
            "validatingwebhookconfiguration",
            name,
            "--ignore-not-found",
        ],
        None,
    );
}

/// Standard base64, for caBundle.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Runs `kubectl agent ARGS` in `ns` (the plugin binary, as kubectl would)
/// and returns its exit code with its output.
pub fn agent(k: &Kubectl, ns: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(plugin_bin())
        .args(["-n", ns])
        .args(args)
        .env("KUBECONFIG", &k.kubeconfig)
        .output()
        .expect("kubectl-agent runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm` (from `HELM`, else PATH) against the harness cluster.
pub fn helm(k: &Kubectl, args: &[&str]) -> Run {
    let bin = std::env::var("HELM").unwrap_or_else(|_| "helm".into());
    let run: Run = Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", &k.kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"))
        .into();
    if run.ok && matches!(args.first(), Some(&("install" | "upgrade"))) {
        wait_for_admission(k);
    }
    run
}

/// How long a fresh release's admission webhook may take to be reachable.
const ADMISSION_READY: Duration = Duration::from_secs(60);

/// Waits until the API server reaches the session webhook: `--wait` sees
/// the operator's pods Ready, but kube-proxy programs the webhook
/// Service's endpoints a moment later, and a write in between is refused
/// ("failed calling webhook ... connection refused", seen in CI). A
/// server-side dry run of a session is answered by the webhook once it is
/// reachable (or at once where the chart installs none).
pub fn wait_for_admission(k: &Kubectl) {
    let probe = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata: {{name: admission-probe, namespace: default}}\nspec: {{image: {}, tools: []}}\n",
        sandbox_image()
    );
    let start = std::time::Instant::now();
    loop {
        let r = k.run(&["create", "--dry-run=server", "-f", "-"], Some(&probe));
        let unreachable = !r.ok && r.stderr.contains("failed calling webhook");
        if !unreachable || start.elapsed() > ADMISSION_READY {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sessions in `ns`, name by UID (what owner references name); empty
/// when they cannot be listed.
pub fn sessions_by_uid(k: &Kubectl, ns: &str) -> std::collections::BTreeMap<String, String> {
    let field = |s: &Value, f: &str| s["metadata"][f].as_str().unwrap_or_default().to_owned();
    k.get(&["agentsessions", "-n", ns])
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|s| (field(s, "uid"), field(s, "name")))
        .collect()
}

/// A status condition of `obj` by type: (status, reason, message).
pub fn condition(obj: &Value, type_: &str) -> Option<(String, String, String)> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (field("status"), field("reason"), field("message"))
        })
}

/// A status condition's status and reason, for comparing with a pair.
pub fn status_reason(obj: &Value, type_: &str) -> Option<(String, String)> {
    condition(obj, type_).map(|(status, reason, _)| (status, reason))
}

/// Prints the operator's log, then lets the test's panic continue: the
/// log is what explains a failed end-to-end scenario.
pub fn fail_with_log(log: &Path, panic: Box<dyn std::any::Any + Send>) -> ! {
    eprintln!(
        "---- operator log ----\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    std::panic::resume_unwind(panic)
}

/// A process's peak resident memory in KiB (VmHWM), if it can be read.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The `p` quantile (0..=1) of `sorted`, by nearest rank; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A duration as whole milliseconds, for printed figures.
pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// A whole number from the environment variable `name`, else `default`
/// (the benchmarks' knobs).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A namespace made for one scenario, labelled as given; deleted on drop.
/// The node's InternalIP, where pods reach the host.
pub fn node_ip(k: &Kubectl) -> String {
    let nodes = k.get(&["nodes"]).expect("kubectl get nodes");
    nodes["items"][0]["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap_or_else(|| panic!("the node has no InternalIP: {nodes}"))
        .to_owned()
}

#[derive(Debug)]
pub struct Namespace {
    k: Kubectl,
    pub name: String,
}

impl Namespace {
    pub fn create(k: &Kubectl, name: &str, labels: &[(&str, &str)]) -> Self {
        let _ = k.run(
            &["delete", "namespace", name, "--wait=true", "--timeout=60s"],
            None,
        );
        let mut yaml = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    agentplane.dev/e2e: \"true\"\n"
        );
        for (key, v) in labels {
            yaml.push_str(&format!("    {key}: \"{v}\"\n"));
        }
        let r = k.apply(&yaml);
        assert!(r.ok, "create namespace {name}: {}", r.stderr);
        Self {
            k: k.clone(),
            name: name.to_owned(),
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self
            .k
            .run(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
