//! The checkpoint relay over real mutual TLS, without a cluster: a runner
//! and a checkpoint sink served in-process on loopback with certificates
//! from the operator's CA (as the operator issues them), the operator's
//! in-memory client certificate, the session's export streamed into the
//! sink, stored with bash's state. A runner certificate (server
//! authentication only) cannot stand in for the operator's.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use operator::certs;
use operator::checkpoint::relay;
use runner_api::proto::ExportRequest;
use runner_api::{Client, Target};
use time::OffsetDateTime;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn runner(root: &Path, name: &str) -> sidecar::Runner {
    let workdir = root.join(name);
    std::fs::create_dir_all(&workdir).expect("workdir");
    sidecar::Runner::new(sidecar::RunnerConfig::new(
        workdir,
        root.join(format!("{name}-state")),
        root.join(format!("{name}-spill")),
        toolset::ResolvedToolset::default_enabled(),
    ))
    .expect("runner")
}

async fn client(socket: &Path) -> Client {
    for _ in 0..400 {
        if let Ok(c) = Client::connect(&Target::Unix(socket.to_path_buf())).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing answered on {}", socket.display());
}

async fn bash(c: &mut Client, command: &str) -> String {
    let input = serde_json::json!({ "command": command }).to_string();
    let r = c
        .run(&runner_api::generate_call_id(), "bash", &input, false)
        .await
        .expect("call");
    assert!(!r.is_error, "{command}: {}", r.content);
    r.content
}

async fn listening(addr: SocketAddr) {
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing listens on {addr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_takes_a_runners_export_into_a_sink_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    // The namespace's runner certificate, as the operator's Secret holds it.
    let now = OffsetDateTime::now_utc();
    let ca = certs::new_ca(now).expect("ca");
    let server = certs::runner_cert(&ca, now).expect("runner cert");
    let tls_dir = root.join("tls");
    std::fs::create_dir_all(&tls_dir).expect("tls dir");
    std::fs::write(tls_dir.join("tls.crt"), &server.cert_pem).expect("crt");
    std::fs::write(tls_dir.join("tls.key"), &server.key_pem).expect("key");
    std::fs::write(tls_dir.join("ca.crt"), &ca.cert_pem).expect("ca");

    // The session's runner, on its socket and its mTLS port.
    let source_addr = free_addr();
    let socket = root.join("src.sock");
    tokio::spawn(sidecar::service::serve(
        runner(root, "src"),
        sidecar::service::Listen {
            socket: socket.clone(),
            tcp: None,
            tls: Some((source_addr, tls_dir.clone())),
        },
        std::future::pending(),
    ));
    let mut src = client(&socket).await;
    bash(
        &mut src,
        "mkdir -p proj && echo base > proj/a.txt && cd proj && export CKPT_VAR=relayed",
    )
    .await;
    listening(source_addr).await;

    // A runner certificate is no client: refused at the handshake.
    let store = root.join("store");
    std::fs::create_dir_all(&store).expect("store");
    let sink_addr = free_addr();
    let sink = tokio::spawn(sidecar::checkpoint::sink(sidecar::checkpoint::SinkConfig {
        dir: store.clone(),
        max_archive_bytes: 64 << 20,
        socket: None,
        tls: Some((sink_addr, tls_dir.clone())),
        deadline: Duration::from_secs(120),
    }));
    listening(sink_addr).await;
    let export = || ExportRequest {
        shell_state: true,
        max_bytes: 1 << 20,
        ..ExportRequest::default()
    };
    let impostor = relay::tls_config(&server.cert_pem, &server.key_pem, &ca.cert_pem);
    let e = relay::take(&impostor, source_addr, sink_addr, export())
        .await
        .expect_err("a runner certificate is not a client");
    assert!(
        e.message.contains("cannot connect") || e.message.contains("refused"),
        "{e:?}"
    );
    assert!(
        !e.permanent,
        "a failed handshake may go otherwise next time"
    );
    assert!(!store.join("checkpoint.json").exists());

    // The operator's in-memory client certificate is.
    let op = certs::operator_client_cert(&ca, now).expect("client cert");
    let tls = relay::tls_config(&op.cert_pem, &op.key_pem, &ca.cert_pem);
    // An export the runner refuses as such (here a path that is not
    // there) is permanent: the checkpoint fails at once, not retried.
    let e = relay::take(
        &tls,
        source_addr,
        sink_addr,
        ExportRequest {
            path: "no-such-dir".into(),
            ..export()
        },
    )
    .await
    .expect_err("nothing to export");
    assert!(e.permanent, "{e:?}");
    assert!(
        e.message.contains("refused the export") && e.message.contains("no-such-dir"),
        "{e:?}"
    );
    assert!(!store.join("checkpoint.json").exists());
    let taken = relay::take(&tls, source_addr, sink_addr, export())
        .await
        .expect("taken");
    assert!(taken.entries >= 2, "{taken:?}");
    assert_eq!(taken.file_bytes, 5);
    tokio::time::timeout(Duration::from_secs(30), sink)
        .await
        .expect("the sink ends once stored")
        .expect("joined")
        .expect("stored");
    assert!(store.join("checkpoint.json").exists());

    // Stored as the export sent it, with bash's state. (Restoring a fork
    // from it is sidecar/tests/checkpoint.rs: two runners cannot share one
    // process, whose child reaper is one.)
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("checkpoint.json")).expect("manifest"))
            .expect("json");
    assert_eq!(manifest["shellState"], true);
    let archive = std::fs::metadata(store.join("archive.tar")).expect("archive");
    assert_eq!(manifest["archiveBytes"], archive.len());
    assert!(store.join("shell-state.pb").exists());
    // The source still serves, its state untouched.
    assert_eq!(
        bash(&mut src, "echo $(basename $(pwd)) $CKPT_VAR").await,
        "proj relayed\n"
    );
}
