//! The operator's MCP client against a real MCP server (the official Python
//! SDK, `tests/e2e/mcp_server.py`), over Streamable HTTP on loopback.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use operator::mcp::client::McpClient;
use operator::mcp::destinations::Destinations;

/// The test servers listen on loopback, which the operator reaches only
/// when allowed (as the e2e operator is, with --mcp-allow-cidr).
fn loopback() -> Arc<Destinations> {
    Arc::new(Destinations {
        allowed: vec!["127.0.0.0/8".parse().expect("cidr")],
    })
}

/// The interpreter with the `mcp` package; `scripts/test-all.sh` makes it.
fn python() -> String {
    std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        format!("{home}/.cache/agentplane/venv/bin/python")
    })
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/mcp_server.py");
    let child = Command::new(python())
        .args([script, &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} (run scripts/test-all.sh to create it): {e}",
                python()
            )
        });
    let server = Server(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the MCP server did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, format!("http://127.0.0.1:{port}/mcp"))
}

#[tokio::test]
async fn lists_the_tools_a_real_server_reports() {
    let (_server, url) = start_server();
    let client =
        McpClient::new("docs", &url, Duration::from_secs(10), &loopback()).expect("client");
    let tools = client.list_tools().await.expect("listed");
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["search", "fetch_page", "delete_page"]);
    assert_eq!(
        tools[0].description,
        "Search the documentation for a query."
    );
    assert_eq!(
        tools[0].input_schema["properties"]["query"]["type"],
        "string"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_an_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let client = McpClient::new("gone", &url, Duration::from_secs(2), &loopback()).expect("client");
    let err = client.list_tools().await.expect_err("nothing listens");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("MCP server gone ({url}): cannot connect")),
        "{text}"
    );
}

/// A hostile HTTP server on loopback: every connection gets `answer`
/// (status line, headers and a body of `body_len` bytes of `fill`, streamed),
/// whatever was asked. Returns its URL and a hit counter.
async fn hostile(
    head: &'static str,
    body_len: usize,
    fill: u8,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let head = format!("{head}Content-Length: {body_len}\r\nConnection: close\r\n\r\n");
                if conn.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![fill; 64 << 10];
                let mut left = body_len;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    (format!("http://{addr}/mcp"), hits)
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let (target, target_hits) = hostile("HTTP/1.1 200 OK\r\n", 0, b' ').await;
    let head: &'static str = Box::leak(
        format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}\r\n").into_boxed_str(),
    );
    let (url, _) = hostile(head, 0, b' ').await;
    let client =
        McpClient::new("redir", &url, Duration::from_secs(5), &loopback()).expect("client");
    let err = client
        .list_tools()
        .await
        .expect_err("a redirect is a failure");
    let text = err.to_string();
    assert!(
        text.contains("HTTP 307") && text.contains("not followed"),
        "{text}"
    );
    assert_eq!(
        target_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the POST was replayed to the redirect's target"
    );
}

#[tokio::test]
async fn a_huge_answer_is_refused_without_reading_it() {
    let huge = 256 << 20;
    let (url, _) = hostile(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
        huge,
        b' ',
    )
    .await;
    let client =
        McpClient::new("huge", &url, Duration::from_secs(20), &loopback()).expect("client");
    let err = client.list_tools().await.expect_err("too large");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "larger than {} bytes",
            operator::mcp::client::MAX_BODY_BYTES
        )),
        "{text}"
    );
}

#[tokio::test]
async fn an_error_body_is_not_copied_into_the_message() {
    let (url, _) = hostile(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n",
        64,
        b'S',
    )
    .await;
    let client =
        McpClient::new("leaky", &url, Duration::from_secs(5), &loopback()).expect("client");
    let text = client.list_tools().await.expect_err("500").to_string();
    assert!(text.contains("HTTP 500"), "{text}");
    assert!(!text.contains("SSSS"), "the upstream body leaked: {text}");
}

#[tokio::test]
async fn non_public_destinations_are_refused_unless_allowed() {
    let (_server, url) = start_server();
    let closed = Arc::new(Destinations::default());
    // A literal address is refused before any connection.
    let err = McpClient::new("docs", &url, Duration::from_secs(5), &closed)
        .expect_err("loopback literal")
        .to_string();
    assert!(err.contains("127.0.0.1 is not a public address"), "{err}");
    let meta = "http://169.254.169.254/latest/meta-data";
    let err = McpClient::new("meta", meta, Duration::from_secs(5), &loopback())
        .expect_err("metadata literal")
        .to_string();
    assert!(
        err.contains("169.254.169.254 is not a public address"),
        "{err}"
    );
    // A name that resolves to loopback is refused at resolution.
    let by_name = url.replace("127.0.0.1", "localhost");
    let client = McpClient::new("docs", &by_name, Duration::from_secs(5), &closed).expect("client");
    let err = client
        .list_tools()
        .await
        .expect_err("localhost")
        .to_string();
    assert!(err.contains("is not a public address"), "{err}");
    // Allowed, the same name works.
    let client =
        McpClient::new("docs", &by_name, Duration::from_secs(10), &loopback()).expect("client");
    assert!(!client.list_tools().await.expect("listed").is_empty());
}
