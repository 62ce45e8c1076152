"""examples/agent_loop.py, driven by its scripted model, against the real gateway."""

import os
import subprocess
import sys

from liveenv import live

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "agent_loop.py")
SCRIPT = os.path.join(ROOT, "examples", "agent_loop.scripted.json")


def run_example(*args):
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    p = subprocess.run([sys.executable, EXAMPLE, "--scripted", SCRIPT, *args], env=env,
                       capture_output=True, text=True, timeout=300)
    print(p.stdout, p.stderr)
    return p


def test_the_scripted_agent_loop_with_approvals():
    live()
    p = run_example("--approve")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "model: scripted (ANTHROPIC_API_KEY is unset)" in out
    assert "script mismatch" not in out
    assert "approved bash" in out
    assert "  | 3" in out and "  | step 2" in out  # bash's output, shown while it ran
    assert "tool_result bash ok" in out
    assert "done after 5 model turn(s)" in out


def test_the_scripted_agent_loop_without_approvals_tells_the_model():
    live()
    p = run_example()
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tool_result bash error: Not run: bash is always_ask" in p.stdout
    assert "tool_result read ok" in p.stdout
