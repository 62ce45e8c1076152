"""Reading a kubeconfig's context: server, bearer token and TLS settings.
Needs PyYAML (imported only here). Exec and auth-provider plugins are not
run: a context using one is refused with a message saying so."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile


def load(path: str | None = None, context: str | None = None) -> tuple[str, str | None, ssl.SSLContext | None]:
    """(server URL, bearer token or None, TLS context or None for http)."""
    try:
        import yaml
    except ImportError as e:
        raise ImportError("reading a kubeconfig needs PyYAML (pip install pyyaml)") from e
    path = path or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    base = os.path.dirname(os.path.abspath(path))
    name = context or doc.get("current-context")
    ctx = _named(doc, "contexts", "context", name, path)
    cluster = _named(doc, "clusters", "cluster", ctx.get("cluster"), path)
    user = _named(doc, "users", "user", ctx.get("user"), path) if ctx.get("user") else {}
    if user.get("exec") or user.get("auth-provider"):
        raise ValueError(f"{path}: context {name} authenticates with a plugin; give a token instead")
    server = cluster.get("server")
    if not server:
        raise ValueError(f"{path}: cluster {ctx.get('cluster')} has no server")
    token = user.get("token")
    if not token and user.get("tokenFile"):
        with open(_rel(base, user["tokenFile"]), encoding="utf-8") as f:
            token = f.read().strip()
    if not server.startswith("https:"):
        return server, token, None
    if cluster.get("insecure-skip-tls-verify"):
        raise ValueError(f"{path}: cluster {ctx.get('cluster')} skips TLS verification; this client does not")
    ca_data = _data(cluster, "certificate-authority", base)
    tls = ssl.create_default_context(cadata=ca_data.decode() if ca_data else None)
    cert, key = _data(user, "client-certificate", base), _data(user, "client-key", base)
    if cert and key:
        _load_chain(tls, cert, key)
    return server, token, tls


def _named(doc: dict, section: str, key: str, name, path: str) -> dict:
    for item in doc.get(section) or []:
        if item.get("name") == name:
            return item.get(key) or {}
    raise ValueError(f"{path}: no {key} named {name!r}")


def _rel(base: str, p: str) -> str:
    return p if os.path.isabs(p) else os.path.join(base, p)


def _data(section: dict, key: str, base: str) -> bytes | None:
    """``key-data`` (base64) or the file ``key`` names."""
    if section.get(key + "-data"):
        return base64.b64decode(section[key + "-data"])
    if section.get(key):
        with open(_rel(base, section[key]), "rb") as f:
            return f.read()
    return None


def _load_chain(tls: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a client key only from a file: a private one, gone at once."""
    with tempfile.TemporaryDirectory(prefix="agentplane-") as d:
        cert_path, key_path = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        for p, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        tls.load_cert_chain(cert_path, key_path)
