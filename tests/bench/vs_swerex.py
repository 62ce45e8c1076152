"""The runner against SWE-ReX's `swerex-remote`, measured in one process.

Started by scripts/bench-vs-swerex.sh, which builds the runner (release) and
the Python environment. Both servers run on this machine, on loopback or a
Unix socket, with their files on tmpfs; every loop is bounded by
--iterations and stops by itself, and both servers are stopped at the end.

Per operation and column: --warmup calls, then --iterations timed calls
(perf_counter_ns around each), p50 and p99. Columns:

  runner unix    grpcio stub on the Unix socket (how the executor in the pod
                 reaches it), one channel for the whole run
  runner tcp     the same stub on the loopback TCP listener
  swerex http    the same JSON requests SWE-ReX's client sends, over one
                 kept-alive HTTP/1.1 connection (http.client): the server's
                 own cost, like the runner columns
  swerex client  SWE-ReX's own RemoteRuntime (aiohttp, a new connection per
                 request, as SWE-agent uses it)

Operations: noop (the floor of transport and client: the runner's health
check, SWE-ReX's GET /is_alive), bash `echo hi` in a persistent shell
session (runner: the bash tool, whose state persists across calls; SWE-ReX:
run_in_session in a bash session created once), read of a 1 KiB file, write
of a 1 KiB file, and edit. SWE-ReX has no edit: it is emulated as read_file + write_file with the
replacement done in the client, two round trips, and labelled so.
"""

import argparse
import asyncio
import contextlib
import http.client
import importlib
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc

LINE = "x" * 63 + "\n"
KIB = LINE * 16  # 1024 bytes
assert len(KIB.encode()) == 1024
MARK_A = "MARKER-AAAA"
MARK_B = "MARKER-BBBB"
# The edit target: 1 KiB holding one marker, swapped back and forth.
EDIT_TEXT = MARK_A + "\n" + KIB[len(MARK_A) + 1 :]
assert len(EDIT_TEXT.encode()) == 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(samples, p):
    s = sorted(samples)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


class Failures:
    """Calls that raised or answered wrongly: counted per cell and printed,
    left out of the percentiles. (SWE-ReX's bash gives up on its PS1 after a
    hard-coded 0.1 s, which a loaded machine can exceed.)"""

    def __init__(self):
        self.count = {}
        self.first = {}

    def note(self, key, what):
        self.count[key] = self.count.get(key, 0) + 1
        self.first.setdefault(key, what)


FAILURES = Failures()


def ok_bash(out):
    return out is not None and out.strip() == "hi"


def timed(key, fn, warmup, iterations, check=None):
    for _ in range(warmup):
        try:
            fn()
        except Exception:
            pass
    out = []
    for _ in range(iterations):
        t = time.perf_counter_ns()
        try:
            r = fn()
        except Exception as e:
            FAILURES.note(key, f"{type(e).__name__}: {e}")
            continue
        dt = time.perf_counter_ns() - t
        if check is not None and not check(r):
            FAILURES.note(key, f"wrong answer: {r!r}")
            continue
        out.append(dt)
    return out


async def atimed(key, fn, warmup, iterations, check=None):
    for _ in range(warmup):
        try:
            await fn()
        except Exception:
            pass
    out = []
    for _ in range(iterations):
        t = time.perf_counter_ns()
        try:
            r = await fn()
        except Exception as e:
            FAILURES.note(key, f"{type(e).__name__}: {e}")
            continue
        dt = time.perf_counter_ns() - t
        if check is not None and not check(r):
            FAILURES.note(key, f"wrong answer: {r!r}")
            continue
        out.append(dt)
    return out


def fmt(ns):
    if ns >= 1_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.0f} us"


def stubs(proto, out_dir):
    from grpc_tools import protoc

    proto_dir, name = os.path.split(os.path.abspath(proto))
    rc = protoc.main(
        ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", name]
    )
    if rc != 0:
        raise SystemExit(f"grpc_tools.protoc failed: {rc}")
    sys.path.insert(0, out_dir)
    module = os.path.splitext(name)[0]
    return importlib.import_module(f"{module}_pb2"), importlib.import_module(f"{module}_pb2_grpc")


def wait_for(check, what, proc, log):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}:\n{open(log).read()}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{what} did not come up in 30 s:\n{open(log).read()}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Runner:
    """Our runner through grpcio stubs generated from runner.proto."""

    def __init__(self, pb2, pb2_grpc, target, files, edit_name):
        self.pb2 = pb2
        self.edit_name = edit_name
        self.channel = grpc.insecure_channel(target)
        self.stub = pb2_grpc.RunnerStub(self.channel)
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.health_pb2 = health_pb2
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.files = files
        self.n = 0
        self.mark = MARK_A

    def call(self, name, args):
        self.n += 1
        r = self.stub.Run(
            self.pb2.RunRequest(id=f"bench-{self.n}", name=name, input_json=json.dumps(args)),
            timeout=60,
        )
        if r.is_error:
            raise RuntimeError(f"{name} failed: {r.content}")
        return r.content

    def noop(self):
        r = self.health.Check(self.health_pb2.HealthCheckRequest(), timeout=60)
        if r.status != self.health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError("runner not serving")

    def bash(self):
        return self.call("bash", {"command": "echo hi"})

    def read(self):
        return self.call("read", {"file_path": os.path.join(self.files, "read.txt")})

    def write(self):
        return self.call("write", {"file_path": os.path.join(self.files, "write.txt"), "content": KIB})

    def edit(self):
        new = MARK_B if self.mark == MARK_A else MARK_A
        out = self.call(
            "edit",
            {"file_path": os.path.join(self.files, self.edit_name), "old_string": self.mark, "new_string": new},
        )
        self.mark = new
        return out

    def close(self):
        self.channel.close()


class SwerexHttp:
    """The JSON SWE-ReX's client sends, over one kept-alive connection."""

    def __init__(self, port, token, files, edit_name):
        self.edit_name = edit_name
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"X-API-Key": token, "Content-Type": "application/json"}
        self.files = files
        self.mark = MARK_A

    def reconnect(self):
        """uvicorn closes a connection idle for 5 s: called before each
        column, so its warm-up and timed calls share one fresh connection."""
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def post(self, endpoint, payload):
        self.conn.request("POST", f"/{endpoint}", body=json.dumps(payload), headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{endpoint}: HTTP {r.status}: {body[:500]!r}")
        return json.loads(body)

    def noop(self):
        self.conn.request("GET", "/is_alive", headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"is_alive: HTTP {r.status}: {body[:500]!r}")

    def bash(self):
        return self.post(
            "run_in_session",
            {"command": "echo hi", "session": "bench", "action_type": "bash", "check": "raise"},
        )["output"]

    def read(self):
        return self.post("read_file", {"path": os.path.join(self.files, "read.txt")})["content"]

    def write(self):
        return self.post("write_file", {"path": os.path.join(self.files, "write.txt"), "content": KIB})

    def edit(self):
        path = os.path.join(self.files, self.edit_name)
        text = self.post("read_file", {"path": path})["content"]
        new = MARK_B if self.mark == MARK_A else MARK_A
        if text.count(self.mark) != 1:
            raise RuntimeError("edit emulation: marker not unique")
        self.post("write_file", {"path": path, "content": text.replace(self.mark, new)})
        self.mark = new


class SwerexClient:
    """SWE-ReX's own RemoteRuntime."""

    def __init__(self, port, token, files, edit_name):
        self.edit_name = edit_name
        from swerex.runtime.remote import RemoteRuntime

        self.rt = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        self.files = files
        self.mark = MARK_A

    async def noop(self):
        if not (await self.rt.is_alive()).is_alive:
            raise RuntimeError("swerex-remote not alive")

    async def bash(self):
        from swerex.runtime.abstract import BashAction

        return (await self.rt.run_in_session(BashAction(command="echo hi", session="bench"))).output

    async def read(self):
        from swerex.runtime.abstract import ReadFileRequest

        return (await self.rt.read_file(ReadFileRequest(path=os.path.join(self.files, "read.txt")))).content

    async def write(self):
        from swerex.runtime.abstract import WriteFileRequest

        await self.rt.write_file(WriteFileRequest(path=os.path.join(self.files, "write.txt"), content=KIB))

    async def edit(self):
        from swerex.runtime.abstract import ReadFileRequest, WriteFileRequest

        path = os.path.join(self.files, self.edit_name)
        text = (await self.rt.read_file(ReadFileRequest(path=path))).content
        new = MARK_B if self.mark == MARK_A else MARK_A
        if text.count(self.mark) != 1:
            raise RuntimeError("edit emulation: marker not unique")
        await self.rt.write_file(WriteFileRequest(path=path, content=text.replace(self.mark, new)))
        self.mark = new


def spawn_times(iterations, warmup):
    """The bare cost of starting `bash -c true` from Python, two ways."""
    env = dict(os.environ)

    def run():
        subprocess.run(["/bin/bash", "-c", "true"], check=True)

    def pspawn():
        pid = os.posix_spawn("/bin/bash", ["bash", "-c", "true"], env)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError("bash -c true failed")

    return {
        "subprocess.run": timed(("spawn", "subprocess.run"), run, warmup, iterations),
        "os.posix_spawn + waitpid": timed(("spawn", "posix_spawn"), pspawn, warmup, iterations),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", required=True, help="the agent-sidecar binary (release build)")
    ap.add_argument("--proto", required=True, help="runner-api/proto/runner.proto")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--tmpfs", default="/dev/shm", help="a tmpfs directory for every file")
    args = ap.parse_args()
    if not (1 <= args.iterations <= 100_000 and 0 <= args.warmup <= 10_000):
        raise SystemExit("--iterations must be 1..100000 and --warmup 0..10000")

    root = tempfile.mkdtemp(prefix="bench-vs-swerex-", dir=args.tmpfs)
    procs = []
    try:
        ours_files = os.path.join(root, "runner-work")
        rex_files = os.path.join(root, "swerex-files")
        for d in (ours_files, rex_files):
            os.makedirs(d)
            # One edit file per column: each column's client swaps its own marker.
            names = [("read.txt", KIB), ("write.txt", KIB)]
            names += [(f"edit-{c}.txt", EDIT_TEXT) for c in ("unix", "tcp", "http", "client")]
            for name, text in names:
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
        os.makedirs(os.path.join(root, "stubs"))
        pb2, pb2_grpc = stubs(args.proto, os.path.join(root, "stubs"))

        # Our runner: Unix socket plus the loopback listener.
        sock = os.path.join(root, "runner.sock")
        tcp = f"127.0.0.1:{free_port()}"
        runner_log = os.path.join(root, "runner.log")
        runner = subprocess.Popen(
            [
                args.runner, "serve", "--socket", sock, "--listen", tcp,
                "--workdir", ours_files,
                "--state-dir", os.path.join(root, "runner-state"),
                "--spill-dir", os.path.join(root, "runner-spill"),
            ],
            stdin=subprocess.DEVNULL, stdout=open(runner_log, "w"), stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        procs.append(runner)

        # SWE-ReX: swerex-remote from the same venv, loopback only.
        token = "bench-token"
        rex_port = free_port()
        rex_log = os.path.join(root, "swerex.log")
        rex_bin = os.path.join(os.path.dirname(sys.executable), "swerex-remote")
        rex = subprocess.Popen(
            [rex_bin, "--host", "127.0.0.1", "--port", str(rex_port), "--auth-token", token],
            stdin=subprocess.DEVNULL, stdout=open(rex_log, "w"), stderr=subprocess.STDOUT,
        )
        procs.append(rex)

        def runner_up():
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            with grpc.insecure_channel(f"unix://{sock}") as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                return r.status == health_pb2.HealthCheckResponse.SERVING

        def rex_up():
            c = http.client.HTTPConnection("127.0.0.1", rex_port, timeout=1)
            c.request("GET", "/is_alive", headers={"X-API-Key": token})
            return c.getresponse().status == 200

        wait_for(runner_up, "agent-sidecar", runner, runner_log)
        wait_for(rex_up, "swerex-remote", rex, rex_log)

        rex_http = SwerexHttp(rex_port, token, rex_files, "edit-http.txt")
        rex_http.post("create_session", {"session": "bench", "session_type": "bash"})
        rex_client = SwerexClient(rex_port, token, rex_files, "edit-client.txt")
        ours_unix = Runner(pb2, pb2_grpc, f"unix://{sock}", ours_files, "edit-unix.txt")
        ours_tcp = Runner(pb2, pb2_grpc, tcp, ours_files, "edit-tcp.txt")

        # Every column answers correctly before anything is timed.
        for c in (ours_unix, ours_tcp):
            assert c.bash() == "hi\n", c.bash()
            assert "x" * 63 in c.read()
            c.write()
            c.edit()
            c.edit()
        assert rex_http.bash().strip() == "hi", rex_http.bash()
        assert rex_http.read() == KIB
        rex_http.write()
        rex_http.edit()
        rex_http.edit()
        assert asyncio.run(rex_client.bash()).strip() == "hi"
        with open(os.path.join(ours_files, "write.txt")) as f:
            assert f.read() == KIB
        with open(os.path.join(rex_files, "edit-http.txt")) as f:
            assert f.read() == EDIT_TEXT

        ops = ["noop", "bash", "read", "write", "edit"]
        results = {}
        n, w = args.iterations, args.warmup
        for op in ops:
            check = ok_bash if op == "bash" else None
            for col, client in (("runner unix", ours_unix), ("runner tcp", ours_tcp), ("swerex http", rex_http)):
                if client is rex_http:
                    rex_http.reconnect()
                results[(op, col)] = timed((op, col), getattr(client, op), w, n, check)

            async def client_col(op=op, check=check):
                return await atimed((op, "swerex client"), getattr(rex_client, op), w, n, check)

            # RemoteRuntime prints the class of every exception it re-raises.
            with contextlib.redirect_stdout(io.StringIO()):
                results[(op, "swerex client")] = asyncio.run(client_col())
        spawns = spawn_times(n, w)
        ours_unix.close()
        ours_tcp.close()

        # Both servers stay healthy to the end.
        assert runner.poll() is None and rex.poll() is None

        from importlib.metadata import version

        print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
        print(
            f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; "
            f"files on {args.tmpfs}"
        )
        print(
            f"versions: runner {args.runner}; swe-rex {version('swe-rex')}; grpcio {version('grpcio')}; "
            f"Python {sys.version.split()[0]}"
        )
        print(f"iterations: {n} timed per cell after {w} warm-up")
        print()
        cols = ["runner unix", "runner tcp", "swerex http", "swerex client"]
        head = f"{'op':<8}" + "".join(f"{c + ' p50/p99':>26}" for c in cols)
        head += f"{'http/unix p50':>15}{'client/unix p50':>17}"
        print(head)
        for op in ops:
            row = f"{op:<8}"
            for c in cols:
                s = results[(op, c)]
                row += f"{fmt(pct(s, 50)) + ' / ' + fmt(pct(s, 99)):>26}"
            base = pct(results[(op, "runner unix")], 50)
            row += f"{pct(results[(op, 'swerex http')], 50) / base:>14.1f}x"
            row += f"{pct(results[(op, 'swerex client')], 50) / base:>16.1f}x"
            print(row)
        print()
        if FAILURES.count:
            print("failed calls (left out of the percentiles):")
            for (op, col), k in sorted(FAILURES.count.items()):
                print(f"  {op} / {col}: {k} of {n}; first: {FAILURES.first[(op, col)][:160]}")
        else:
            print("failed calls: none")
        print("noop: the transport and client floor -- runner: grpc.health.v1.Health/Check; SWE-ReX: GET /is_alive.")
        print("edit on SWE-ReX: no edit endpoint; emulated as read_file + write_file (two round trips).")
        print("bash on SWE-ReX: run_in_session in one bash session (pexpect); on the runner: the bash tool.")
        print()
        print("bare `bash -c true` spawn from this Python process:")
        for k, s in spawns.items():
            print(f"  {k:<26} p50 {fmt(pct(s, 50))}, p99 {fmt(pct(s, 99))}")
        print()
        print("targets (runner, tmpfs): bash p50 <= 2.5 ms; read/write/edit p50 <= 150 us")
        print("  (the second figure takes the noop p50 -- this Python client's own floor -- off;")
        print("  it approximates the runner's share, it is not a measurement of it)")
        floor = pct(results[("noop", "runner unix")], 50)
        for op, target in (("bash", 2_500_000), ("read", 150_000), ("write", 150_000), ("edit", 150_000)):
            p50 = pct(results[(op, "runner unix")], 50)
            net = p50 - floor
            print(
                f"  {op:<6} runner unix p50 {fmt(p50):>9}, less the floor {fmt(net):>9}: "
                f"{'met' if p50 <= target else 'met less the floor' if net <= target else 'NOT met'}"
            )
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
