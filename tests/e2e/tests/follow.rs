//! `kubectl agent bash --follow` across a broken connection, without a
//! cluster: the real `agent-sidecar` binary serving on a temp socket, behind
//! a proxy the test severs mid-call, standing in for the API server's
//! port-forward (which breaks the same way when the API server restarts or
//! a load balancer idles it out).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kubectl_agent::follow::follow;
use runner_api::proto::RunRequest;
use runner_api::{Client, Serve, Target};
use tokio::net::{UnixListener, UnixStream};

/// A Write the test can read while `follow` writes.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// The runner as a process, killed when the test ends however it ends.
struct Runner(Child);

impl Runner {
    /// Starts `agent-sidecar serve` on `socket` and waits until it answers.
    async fn start(dir: &Path, socket: &Path) -> Runner {
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mut serve = Serve::new(socket.to_str().unwrap(), work.to_str().unwrap());
        serve.state_dir = Some(dir.join("state").to_str().unwrap().into());
        serve.spill_dir = Some(dir.join("spill").to_str().unwrap().into());
        let child = Command::new(e2e::runner_bin())
            .args(runner_api::Invocation::args(&serve))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start agent-sidecar");
        let runner = Runner(child);
        for _ in 0..400 {
            if let Ok(mut c) = Client::connect(&Target::Unix(socket.to_owned())).await
                && c.health().await.unwrap_or(false)
            {
                return runner;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "agent-sidecar did not become healthy on {}",
            socket.display()
        );
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Forwards connections on `front` to `back`; `sever` drops every
/// connection open now, as a broken port-forward does.
struct Proxy {
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    fn start(front: PathBuf, back: PathBuf) -> Proxy {
        let listener = UnixListener::bind(&front).unwrap();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let list = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let back = back.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = UnixStream::connect(&back).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                list.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy { conns }
    }

    fn sever(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

/// A new connection through the proxy, as the plugin opens a new
/// port-forward for each.
async fn connect(path: PathBuf) -> Result<Client, kubectl_agent::Error> {
    Ok(Client::connect(&Target::Unix(path)).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_survives_a_broken_connection_and_prints_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("runner.sock");
    let front = dir.path().join("proxy.sock");
    let _runner = Runner::start(dir.path(), &back).await;
    let proxy = Proxy::start(front.clone(), back);

    let (out, err) = (Shared::default(), Shared::default());
    let req = RunRequest {
        id: "toolu_follow_1".into(),
        name: "bash".into(),
        input_json: r#"{"command":"echo first; sleep 1.5; echo second; echo oops >&2"}"#.into(),
        confirmed: false,
    };
    let follower = {
        let (mut out, mut err, front) = (out.clone(), err.clone(), front.clone());
        tokio::spawn(async move {
            follow(|| connect(front.clone()), "s", req, &mut out, &mut err).await
        })
    };
    for _ in 0..1000 {
        if out.text() == "first\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(out.text(), "first\n");
    proxy.sever();
    let done = tokio::time::timeout(Duration::from_secs(60), follower)
        .await
        .expect("follow ended")
        .unwrap()
        .unwrap();
    assert_eq!(out.text(), "first\nsecond\n");
    assert_eq!(err.text(), "oops\n");
    assert!(done.reconnects >= 1, "{done:?}");
    assert_eq!(done.content, "first\nsecond\n\noops\n");
    assert!(!done.is_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_not_retried_and_reads_as_the_plugins_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("runner.sock");
    let _runner = Runner::start(dir.path(), &socket).await;
    let req = RunRequest {
        id: "toolu_follow_2".into(),
        name: "web_fetch".into(),
        input_json: "{}".into(),
        confirmed: true,
    };
    let (mut out, mut err) = (Shared::default(), Shared::default());
    let mut connects = 0;
    let res = follow(
        || {
            connects += 1;
            connect(socket.clone())
        },
        "s",
        req,
        &mut out,
        &mut err,
    )
    .await;
    assert!(
        matches!(res, Err(kubectl_agent::Error::NotSandboxTool { .. })),
        "{res:?}"
    );
    assert_eq!(connects, 1);
    assert_eq!(
        res.err().map(|e| e.exit_code()),
        Some(runner_api::exit::REFUSED)
    );
}
