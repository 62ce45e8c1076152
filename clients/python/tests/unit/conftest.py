"""The ``server`` fixture: a real local HTTP server (see httpfake.py)."""

import threading

import pytest

from httpfake import Server


@pytest.fixture
def server():
    s = Server()
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()
