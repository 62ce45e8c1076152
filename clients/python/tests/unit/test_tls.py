"""HTTPS: the server's certificate checked against the given CA, and a
kubeconfig's cluster read with its CA data and token. Needs the openssl
command to make the certificates."""

import base64
import shutil
import ssl
import subprocess
import threading

import pytest

import agentplane as ap
from agentplane import Cluster, Gateway

from httpfake import Server

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=test-ca", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "ext", cwd=d)
    return d


@pytest.fixture
def https_server(certs):
    s = Server()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def https_url(s):
    return f"https://127.0.0.1:{s.server_address[1]}"


def test_the_gateway_is_trusted_through_the_ca_file(https_server, certs):
    https_server.answer = lambda h: h.json(200, {"tools": []})
    assert Gateway(https_url(https_server), "t", ca_file=str(certs / "ca.pem")).session("s").tools() == []


def test_a_server_the_ca_did_not_sign_is_refused(https_server):
    https_server.answer = lambda h: h.json(200, {"tools": []})
    with pytest.raises(ap.ConnectionFailed, match="not trusted"):
        Gateway(https_url(https_server), "t").session("s").tools()
    assert https_server.requests == []


def test_cluster_from_a_kubeconfig(https_server, certs, tmp_path):
    pytest.importorskip("yaml")
    ca = base64.b64encode((certs / "ca.pem").read_bytes()).decode()
    (tmp_path / "kubeconfig").write_text(f"""
apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: dev
  context: {{cluster: c1, user: u1}}
clusters:
- name: c1
  cluster: {{server: "{https_url(https_server)}", certificate-authority-data: "{ca}"}}
users:
- name: u1
  user: {{token: secret-token}}
""")
    https_server.answer = lambda h: h.json(200, {"kind": "AgentSession", "metadata": {"name": "s1"}})
    c = Cluster.from_kubeconfig(str(tmp_path / "kubeconfig"))
    assert c.get_session("default", "s1")["metadata"]["name"] == "s1"
    assert https_server.requests[0].headers["Authorization"] == "Bearer secret-token"


def test_the_total_timeout_holds_over_tls(https_server, certs):
    import time

    def answer(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(100):
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.05)
    https_server.answer = answer
    t0 = time.monotonic()
    with pytest.raises(ap.Timeout):
        Gateway(https_url(https_server), "t", ca_file=str(certs / "ca.pem"), timeout=0.5).session("s").tools()
    assert time.monotonic() - t0 < 3.0


def test_connect_to_opens_the_address_and_checks_the_urls_name(https_server, certs):
    # The URL's port is wrong on purpose: only the connect_to address answers.
    https_server.answer = lambda h: h.json(200, {"tools": []})
    port = https_server.server_address[1]
    g = Gateway("https://localhost:1", "t", ca_file=str(certs / "ca.pem"), connect_to=f"127.0.0.1:{port}")
    assert g.session("s").tools() == []


def test_connect_to_still_checks_the_certificate_against_the_urls_name(https_server, certs):
    https_server.answer = lambda h: h.json(200, {"tools": []})
    port = https_server.server_address[1]
    g = Gateway(f"https://gateway.invalid:{port}", "t", ca_file=str(certs / "ca.pem"),
                connect_to=f"127.0.0.1:{port}")
    with pytest.raises(Exception) as e:
        g.session("s").tools()
    assert "gateway.invalid" in str(e.value) or "certificate" in str(e.value).lower()
