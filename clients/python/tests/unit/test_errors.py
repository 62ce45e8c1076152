"""Error bodies and events mapped to exception classes."""

import json

import pytest

import agentplane as ap
from agentplane.errors import from_event, from_gateway_body, from_kubernetes_body


def body(code, message="m"):
    return json.dumps({"error": {"code": code, "message": message}}).encode()


@pytest.mark.parametrize("code,status,cls", [
    ("unauthenticated", 401, ap.Unauthenticated),
    ("forbidden", 403, ap.Forbidden),
    ("approval_required", 403, ap.ApprovalRequired),
    ("not_found", 404, ap.NotFound),
    ("invalid", 400, ap.Invalid),
    ("too_many_requests", 429, ap.TooManyRequests),
    ("unavailable", 503, ap.Unavailable),
    ("internal", 500, ap.Internal),
    ("conflict", 409, ap.Conflict),
    ("timeout", 504, ap.Timeout),
])
def test_each_code_has_its_class(code, status, cls):
    e = from_gateway_body(status, body(code, "why"))
    assert type(e) is cls and isinstance(e, ap.GatewayError)
    assert (e.code, e.status, e.message) == (code, status, "why")
    assert "why" in str(e) and code in str(e)


def test_the_code_decides_not_the_status():
    # approval_required and forbidden share 403; the code tells them apart.
    assert type(from_gateway_body(403, body("approval_required"))) is ap.ApprovalRequired
    assert type(from_gateway_body(403, body("forbidden"))) is ap.Forbidden


def test_an_unknown_code_is_the_base_class_with_that_code():
    e = from_gateway_body(403, body("refused", "the runner refused"))
    assert type(e) is ap.GatewayError and e.code == "refused" and e.status == 403


def test_a_body_that_is_not_the_gateways_falls_back_to_the_status():
    e = from_gateway_body(503, b"<html>bad gateway</html>")
    assert type(e) is ap.Unavailable and "bad gateway" in e.message
    e = from_gateway_body(502, b"")
    assert type(e) is ap.GatewayError and e.message == "HTTP 502 with no body"


def test_a_long_body_is_cut_in_the_message():
    e = from_gateway_body(500, b"x" * 10_000)
    assert len(e.message) < 600


def test_retry_after_is_kept():
    e = from_gateway_body(429, body("too_many_requests"), retry_after=2.0)
    assert isinstance(e, ap.TooManyRequests) and e.retry_after == 2.0


def test_stream_error_events_get_the_codes_status():
    e = from_event({"code": "unavailable", "message": "runner gone"})
    assert type(e) is ap.Unavailable and e.status == 503 and e.message == "runner gone"
    e = from_event({})
    assert type(e) is ap.Internal


def test_kubernetes_status_objects():
    status = {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409,
              "message": 'agentsessions "x" already exists'}
    e = from_kubernetes_body(409, json.dumps(status).encode())
    assert type(e) is ap.Conflict and "already exists" in e.message
    status.update(reason="NotFound", code=404)
    assert type(from_kubernetes_body(404, json.dumps(status).encode())) is ap.NotFound
    status.update(reason="Invalid", code=422)
    assert type(from_kubernetes_body(422, json.dumps(status).encode())) is ap.Invalid
    assert type(from_kubernetes_body(401, b"Unauthorized")) is ap.Unauthenticated
