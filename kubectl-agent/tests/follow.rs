//! `bash --follow` across a broken connection: a real runner (in process,
//! on a Unix socket) behind a proxy the test can sever mid-call, standing in
//! for the API server's port-forward, which a unit test cannot run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kubectl_agent::follow::follow;
use sidecar::proto::RunRequest;
use sidecar::proto::runner_client::RunnerClient;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Endpoint, Uri};

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

async fn channel(
    path: PathBuf,
) -> Result<RunnerClient<tonic::transport::Channel>, kubectl_agent::Error> {
    let ch = Endpoint::from_static("http://127.0.0.1:1")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| kubectl_agent::Error::PortForward {
            pod: "test".into(),
            message: e.to_string(),
        })?;
    Ok(RunnerClient::new(ch))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_survives_a_broken_connection_and_prints_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let runner = sidecar::Runner::new(sidecar::RunnerConfig::new(
        work,
        dir.path().join("state"),
        dir.path().join("spill"),
        toolset::ResolvedToolset::default_enabled(),
    ))
    .unwrap();
    let back = dir.path().join("runner.sock");
    let front = dir.path().join("proxy.sock");
    let listen = sidecar::service::Listen {
        socket: back.clone(),
        tcp: None,
    };
    tokio::spawn(sidecar::service::serve(
        runner,
        listen,
        std::future::pending(),
    ));
    for _ in 0..200 {
        if back.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
            follow(|| channel(front.clone()), "s", req, &mut out, &mut err).await
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
