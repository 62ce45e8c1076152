//! Stock gRPC clients against the real binary: Python `grpcio` with an
//! unmodified channel on the Unix socket (`unix://` + path, which makes
//! grpc-core send the path as `:authority`) and on loopback TCP, and server
//! reflection from grpcio-reflection (v1alpha) and a tonic client (v1).
//!
//! The Python is `$AGENTPLANE_PYTHON` (set by scripts/test-all.sh), or the
//! venv scripts/python-env.sh creates -- the tests never skip for want of it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::Sidecar;
use serde_json::Value;

const RUNNER: &str = "agentplane.runner.v1.Runner";
const HEALTH: &str = "grpc.health.v1.Health";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The interpreter with grpcio, grpcio-tools and grpcio-reflection.
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("AGENTPLANE_PYTHON") {
            return PathBuf::from(p);
        }
        let out = Command::new(repo().join("scripts/python-env.sh"))
            .output()
            .expect("run scripts/python-env.sh");
        assert!(
            out.status.success(),
            "scripts/python-env.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// Runs tests/interop/grpc_client.py and parses the JSON object it prints.
fn client(args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/grpc_client.py"))
        .args(args)
        .output()
        .expect("run the Python client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "Python gRPC client {args:?} failed:\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client printed no JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn proto() -> String {
    // The runner's contract lives in the runner-api crate.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../runner-api/proto/runner.proto")
        .to_str()
        .unwrap()
        .to_owned()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// What every stub-based session must have seen, whatever the transport.
fn assert_stub_session(v: &Value, target: &str) {
    assert_eq!(v["target"], target);
    assert_eq!(v["health"][""], "SERVING", "{v}");
    assert_eq!(v["health"][RUNNER], "SERVING", "{v}");
    assert_eq!(v["run"]["content"], "hi\n", "{v}");
    assert_eq!(v["run"]["is_error"], false, "{v}");
    assert_eq!(
        v["tools"],
        serde_json::json!(["bash", "read", "write", "edit", "glob", "grep"])
    );
    // A refusal arrives as a status with its metadata, not as a reset.
    assert_eq!(v["refusal"]["code"], "INVALID_ARGUMENT", "{v}");
    assert_eq!(
        v["refusal"]["agentplane-refusal"], "not_sandbox_tool",
        "{v}"
    );
    // Many calls on the one connection, so later header blocks refer to the
    // client's HPACK dynamic table (and evict from it): each got its answer.
    let echoes = v["echoes"].as_array().expect("echoes");
    assert_eq!(echoes.len(), 40);
    for (i, e) in echoes.iter().enumerate() {
        assert_eq!(e, &Value::from(format!("{i}\n")), "{v}");
    }
}

#[tokio::test]
async fn python_grpcio_unix_socket_unmodified_channel() {
    let s = Sidecar::start().await;
    // Exactly what the bug report's user wrote: "unix://" + an absolute path.
    let target = format!("unix://{}", s.socket.display());
    let v = client(&["stubs", &proto(), &target]);
    assert_stub_session(&v, &target);
}

#[tokio::test]
async fn python_grpcio_loopback_tcp() {
    let addr = format!("127.0.0.1:{}", free_port());
    let _s = Sidecar::start_with(&["--listen", &addr]).await;
    let v = client(&["stubs", &proto(), &addr]);
    assert_stub_session(&v, &addr);
}

fn assert_reflection(v: &Value) {
    let services: Vec<&str> = v["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for want in [
        RUNNER,
        HEALTH,
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(services.contains(&want), "{want} not in {services:?}");
    }
    assert_eq!(v["runner_file"], "runner.proto");
    assert_eq!(
        v["runner_methods"],
        serde_json::json!({
            "Run": {"input": "agentplane.runner.v1.RunRequest", "output": "agentplane.runner.v1.RunResponse"},
            "RunStream": {"input": "agentplane.runner.v1.RunRequest", "output": "agentplane.runner.v1.RunEvent"},
            "Attach": {"input": "agentplane.runner.v1.AttachRequest", "output": "agentplane.runner.v1.RunEvent"},
            "Cancel": {"input": "agentplane.runner.v1.CancelRequest", "output": "agentplane.runner.v1.CancelResponse"},
            "ListTools": {"input": "agentplane.runner.v1.ListToolsRequest", "output": "agentplane.runner.v1.ListToolsResponse"},
            "Export": {"input": "agentplane.runner.v1.ExportRequest", "output": "agentplane.runner.v1.ExportChunk"},
            "Import": {"input": "agentplane.runner.v1.ImportChunk", "output": "agentplane.runner.v1.ImportResponse"},
            "Hold": {"input": "agentplane.runner.v1.HoldRequest", "output": "agentplane.runner.v1.HoldEvent"},
        })
    );
    assert_eq!(v["health_methods"], serde_json::json!(["Check", "Watch"]));
    // A call made with message types built from the reflected schema alone.
    assert_eq!(v["run"]["content"], "reflected\n", "{v}");
    assert_eq!(v["run"]["is_error"], false);
}

#[tokio::test]
async fn python_reflection_lists_and_describes_services() {
    let addr = format!("127.0.0.1:{}", free_port());
    let s = Sidecar::start_with(&["--listen", &addr]).await;
    let unix = format!("unix://{}", s.socket.display());
    for target in [unix.as_str(), addr.as_str()] {
        let v = client(&["reflect", target]);
        assert_eq!(v["target"], target);
        assert_reflection(&v);
    }
}

/// grpc.reflection.v1 (the version grpcurl and grpc-go use) from a tonic
/// client: the same services, and the runner's file descriptor.
#[tokio::test]
async fn reflection_v1_lists_services_and_serves_the_runner_descriptor() {
    use prost::Message;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let s = Sidecar::start().await;
    let path = s.socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .expect("connect");
    let mut client = ServerReflectionClient::new(channel);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol(format!("{RUNNER}.Run")),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection call")
        .into_inner();

    let first = stream.message().await.unwrap().unwrap().message_response;
    let Some(MessageResponse::ListServicesResponse(list)) = first else {
        panic!("expected a service list, got {first:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            RUNNER,
            HEALTH,
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ]
        .map(String::from)
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );

    let second = stream.message().await.unwrap().unwrap().message_response;
    let Some(MessageResponse::FileDescriptorResponse(files)) = second else {
        panic!("expected a file descriptor, got {second:?}");
    };
    let fd = prost_types::FileDescriptorProto::decode(&files.file_descriptor_proto[0][..])
        .expect("a FileDescriptorProto");
    assert_eq!(fd.name(), "runner.proto");
    assert_eq!(fd.package(), "agentplane.runner.v1");
    let svc = &fd.service[0];
    assert_eq!(svc.name(), "Runner");
    let methods: Vec<&str> = svc.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        [
            "Run",
            "RunStream",
            "Attach",
            "Cancel",
            "ListTools",
            "Export",
            "Import",
            "Hold"
        ]
    );
}

/// grpcurl (grpc-go, reflection v1), `$AGENTPLANE_GRPCURL` or built once
/// from the Go module proxy by tests/interop/grpcurl.sh.
fn grpcurl() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("AGENTPLANE_GRPCURL") {
            return PathBuf::from(p);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/grpcurl.sh");
        let out = Command::new(script).output().expect("run grpcurl.sh");
        assert!(
            out.status.success(),
            "tests/interop/grpcurl.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn run_grpcurl(args: &[&str]) -> String {
    let out = Command::new(grpcurl())
        .args(args)
        .output()
        .expect("run grpcurl");
    assert!(
        out.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The commands docs/runner.md shows, on the socket and on TCP: the service
/// list and a Run call, with no .proto file (reflection only).
#[tokio::test]
async fn grpcurl_lists_services_and_calls_run_through_reflection() {
    let addr = format!("127.0.0.1:{}", free_port());
    let s = Sidecar::start_with(&["--listen", &addr]).await;
    // grpcurl v1.9.3's `-unix PATH` dials TCP (its own bug); the `unix://`
    // target is grpc-go's standard form.
    let unix = format!("unix://{}", s.socket.display());
    let targets: [(&[&str], &str); 2] = [(&["-plaintext"], &unix), (&["-plaintext"], &addr)];
    for (flags, address) in targets {
        let list = run_grpcurl(&[flags, &[address, "list"]].concat());
        let mut services: Vec<&str> = list.lines().collect();
        services.sort();
        assert_eq!(
            services,
            [
                RUNNER,
                HEALTH,
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ]
        );
        let desc = run_grpcurl(&[flags, &[address, "describe", RUNNER]].concat());
        assert!(
            desc.contains("rpc Run ( .agentplane.runner.v1.RunRequest ) returns ( .agentplane.runner.v1.RunResponse );"),
            "{desc}"
        );
        let req = serde_json::json!({
            "id": "grpcurl-1",
            "name": "bash",
            "input_json": serde_json::json!({"command": "echo via grpcurl"}).to_string(),
        })
        .to_string();
        let method = format!("{RUNNER}/Run");
        let out = run_grpcurl(&[flags, &["-d", &req, address, &method]].concat());
        let v: Value = serde_json::from_str(&out).expect("grpcurl prints JSON");
        assert_eq!(v["content"], "via grpcurl\n", "{out}");
        // proto3 JSON leaves a false bool out.
        assert!(v.get("isError").is_none(), "{out}");
    }
}
