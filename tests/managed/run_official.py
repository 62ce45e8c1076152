#!/usr/bin/env python3
"""Run the official anthropic SDK `EnvironmentWorker` against the stand-in.

Starts the stand-in (or attaches to one with `--standin URL`), enqueues the
session script(s), runs `anthropic.lib.environments.EnvironmentWorker` with
environment-key auth and a temporary workdir until every enqueued session is
done and its work item is stopped (failing after `--timeout` seconds), then
prints the stand-in's record (or writes it with `--out FILE`).

    ~/.cache/agentplane/venv/bin/python tests/managed/run_official.py --out tests/managed/official-results.json
"""

from __future__ import annotations

import os
import sys
import json
import time
import asyncio
import logging
import argparse
import tempfile
import subprocess
import urllib.request
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KEY = "envkey-official-0"


def http(url: str, method: str = "GET", body: Optional[dict[str, Any]] = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def start_standin(key: str, lease_ttl: int, mem_limit: Optional[int]) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, os.path.join(HERE, "standin.py"), "--listen", "127.0.0.1:0", "--key", key]
    cmd += ["--lease-ttl", str(lease_ttl)]
    if mem_limit:
        cmd = ["prlimit", f"--as={mem_limit}", "--"] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("LISTENING "):
            return proc, line.split()[1]
    proc.kill()
    raise RuntimeError("stand-in did not report LISTENING within 30 s")


def all_done(record: dict[str, Any], items: list[dict[str, str]]) -> bool:
    for it in items:
        s = record["sessions"].get(it["session_id"], {})
        w = record["work"].get(it["work_id"], {})
        if not s.get("done") or w.get("state") != "stopped":
            return False
    return True


async def run_worker(
    base_url: str,
    key: str,
    env_id: str,
    items: list[dict[str, str]],
    workdir: str,
    timeout: float,
    max_idle: float,
    workers: int,
) -> None:
    from anthropic import AsyncAnthropic
    from anthropic.lib.environments import EnvironmentWorker

    # The worker's sub-clients are Bearer-only (the SDK drops the api key from them);
    # the parent client just needs to exist, pointed at the stand-in.
    client = AsyncAnthropic(base_url=base_url, api_key="unused-by-the-worker", max_retries=2)
    tasks = []
    for i in range(workers):
        wd = workdir if workers == 1 else os.path.join(workdir, f"w{i}")
        os.makedirs(wd, exist_ok=True)
        worker = EnvironmentWorker(
            client,
            environment_id=env_id,
            environment_key=key,
            workdir=wd,
            max_idle=max_idle,
            worker_id=f"official-worker-{i}",
        )
        tasks.append(asyncio.create_task(worker.run()))
    deadline = time.monotonic() + timeout
    try:
        while True:
            for t in tasks:
                if t.done():
                    t.result()  # re-raise a worker crash
                    raise RuntimeError("EnvironmentWorker.run returned early")
            record = await asyncio.to_thread(http, base_url + "/_standin/record")
            if all_done(record, items):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"sessions not done and stopped after {timeout:.0f} s")
            await asyncio.sleep(0.5)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


def main() -> int:
    p = argparse.ArgumentParser(description="run the official EnvironmentWorker against the stand-in")
    p.add_argument("--standin", help="URL of a running stand-in (default: start one)")
    p.add_argument("--key", default=DEFAULT_KEY, help="environment key (must be accepted by the stand-in)")
    p.add_argument("--environment-id", default="env_standin")
    p.add_argument("--script", action="append", help="session script(s) to enqueue (default script.json)")
    p.add_argument("--count", type=int, default=1, help="sessions per script")
    p.add_argument("--workers", type=int, default=1, help="EnvironmentWorker instances (each serves one item at a time)")
    p.add_argument("--max-idle", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--lease-ttl", type=int, default=30)
    p.add_argument("--mem-limit", type=int, default=2_000_000_000, help="prlimit --as for a started stand-in (0: none)")
    p.add_argument("--out", help="write the record here instead of stdout")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr)

    proc = None
    base = args.standin
    if base is None:
        proc, base = start_standin(args.key, args.lease_ttl, args.mem_limit or None)
    base = base.rstrip("/")
    try:
        items: list[dict[str, str]] = []
        scripts = args.script or [os.path.join(HERE, "script.json")]
        for path in scripts:
            with open(path) as f:
                script = json.load(f)
            items += http(base + "/_standin/enqueue", "POST", {"session": script, "count": args.count})["items"]
        with tempfile.TemporaryDirectory(prefix="official-worker-") as wd:
            asyncio.run(
                run_worker(base, args.key, args.environment_id, items, wd, args.timeout, args.max_idle, args.workers)
            )
        record = http(base + "/_standin/record")
        record["items"] = items
        record["scripts"] = [os.path.basename(s) for s in scripts]
        out = json.dumps(record, indent=1, sort_keys=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(out + "\n")
        else:
            print(out)
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
