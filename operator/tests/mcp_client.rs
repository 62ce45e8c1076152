//! The operator's MCP client against a real MCP server (the official Python
//! SDK, `tests/e2e/mcp_server.py`), over Streamable HTTP on loopback.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use operator::mcp::McpClient;

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
    let client = McpClient::new("docs", &url, Duration::from_secs(10)).expect("client");
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
    let client = McpClient::new("gone", &url, Duration::from_secs(2)).expect("client");
    let err = client.list_tools().await.expect_err("nothing listens");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("MCP server gone ({url}): cannot connect")),
        "{text}"
    );
}
