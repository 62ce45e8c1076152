#!/usr/bin/env python3
"""Conformance driver: the runner against the reference, call by call.

For every case in cases/*.json it makes two identical fresh directories
(same seed files, same modes, same mtimes), runs the case's calls through the
reference program (anthropic-sdk-go tools/agenttoolset, in-process) on one and
through `agent-sidecar serve` over its Unix socket on the other, and compares
each call's `content` and `is_error` after normalising the directory prefixes,
then the two directory trees left behind (paths, kinds, modes, contents).

A difference in a call that divergences.json lists for the case is "known"
and counts as passed; any other difference fails the run.

    driver.py run   --ref BIN --runner BIN [--case ID]... [--verbose] [--json OUT]
    driver.py bench --ref BIN --runner BIN [--iterations N]

Python 3.11, standard library only.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
DIVERGENCES = os.path.join(HERE, "divergences.json")

# Seed mtimes: fixed, distinct, in the past, so glob's newest-first order is
# the same on both sides and does not depend on how fast the seeding ran.
MTIME_BASE = 1_700_000_000

# One clean environment for both sides (no rg on PATH, so the
# reference's grep is its built-in walker rather than whatever rg is around).
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def clean_env(home):
    return {
        "PATH": PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "USER": "root",
        "CONFORMANCE": "1",
        # Both sides must keep this out of the shell.
        "ANTHROPIC_API_KEY": "conformance-not-a-key",
    }


# Where each side's program is started from: never the workdir, so a call
# that runs in the program's own directory instead of the workdir shows up
# (issue 21). A case runs under the variants it lists ("start_from"), or
# under one picked from its id, so the suite as a whole covers them all.
START_FROM = ("root", "outside", "parent", "gone", "lying-pwd")


def start_variant(case):
    listed = case.get("start_from")
    if listed:
        return listed
    digest = hashlib.sha256(case["id"].encode()).digest()
    return [START_FROM[digest[0] % len(START_FROM)]]


class Start:
    """A program's starting directory and environment for one variant:
    `root` is /, `outside` the directory beside the workdir, `parent` the
    directory holding the workdir, `gone` a directory removed once the
    program is up (the runner only; a process cannot start in a removed
    directory, so the reference starts in its parent), `lying-pwd` / with a
    PWD naming no directory. PWD is set as a login shell would set it."""

    def __init__(self, variant, side, env):
        self.variant = variant
        self.env = dict(env)
        self.removable = None
        if variant == "root":
            self.cwd = "/"
        elif variant == "outside":
            self.cwd = side.outside
        elif variant == "parent":
            self.cwd = side.root
        elif variant == "gone":
            self.removable = tempfile.mkdtemp(prefix="start-", dir=side.root)
            self.cwd = self.removable
        elif variant == "lying-pwd":
            self.cwd = "/"
        else:
            raise ValueError(f"unknown start_from variant {variant!r}")
        self.env["PWD"] = "/no/such/dir" if variant == "lying-pwd" else self.cwd

    def started(self):
        """The program is up: a `gone` directory goes now."""
        if self.removable:
            shutil.rmtree(self.removable, ignore_errors=True)
            self.removable = None


class Side:
    """One side's directories: <base>/<name>/{w,outside,state,spill}."""

    def __init__(self, base, name):
        self.root = os.path.join(base, name)
        self.workdir = os.path.join(self.root, "w")
        self.outside = os.path.join(self.root, "outside")
        self.state = os.path.join(self.root, "state")
        self.spill = os.path.join(self.root, "spill")
        self.sock = os.path.join(self.root, "s.sock")
        for d in (self.workdir, self.outside):
            os.makedirs(d)

    def subst(self, text):
        return text.replace("$WORKDIR", self.workdir).replace("$OUTSIDE", self.outside)

    def normalise(self, text):
        for real, ph in ((self.workdir, "$WORKDIR"), (self.outside, "$OUTSIDE"),
                         (self.spill, "$SPILL"), (self.state, "$STATE")):
            text = text.replace(os.path.realpath(real), ph).replace(real, ph)
        # Where each side saves long output: the reference a fresh
        # /tmp/bash-output-*/<random>.txt, the runner <spill>/<call id>.txt.
        text = re.sub(r"/tmp/bash-output-[^/\s]+/[^\s/]+\.txt", "$SAVED", text)
        text = re.sub(r"\$SPILL/[A-Za-z0-9._-]+\.txt", "$SAVED", text)
        return text


# ---------------------------------------------------------------- seeding


def file_bytes(spec):
    if "text" in spec:
        data = spec["text"].encode()
    elif "b64" in spec:
        data = base64.b64decode(spec["b64"])
    elif "lines" in spec:
        # {"lines": N, "line": "text {n}"}: N numbered lines, each ending in \n
        tmpl = spec.get("line", "line {n}")
        data = "".join(tmpl.format(n=i) + "\n" for i in range(1, spec["lines"] + 1)).encode()
    else:
        data = b""
    if "repeat" in spec:
        data = data * spec["repeat"]
    return data


def seed(side, case):
    s = case.get("seed", {})
    n = 0
    stamped = []
    for d in s.get("dirs", []):
        p = side.subst(d if d.startswith("$") else os.path.join(side.workdir, d))
        os.makedirs(p, exist_ok=True)
    for spec in s.get("files", []):
        rel = spec["path"]
        p = side.subst(rel if rel.startswith("$") else os.path.join(side.workdir, rel))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(file_bytes(spec))
        os.chmod(p, int(spec.get("mode", "0644"), 8))
        n += 1
        stamped.append((p, spec.get("mtime", MTIME_BASE + 10 * n)))
    for link, target in s.get("symlinks", {}).items():
        p = side.subst(link if link.startswith("$") else os.path.join(side.workdir, link))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(side.subst(target), p)
    if s.get("fifo"):
        for rel in s["fifo"]:
            os.mkfifo(os.path.join(side.workdir, rel))
    for p, m in stamped:
        os.utime(p, (m, m))
    # Directories last (creating their files moved their mtimes), deepest
    # first, each older than every seeded file unless the case says otherwise.
    dir_mtimes = s.get("dir_mtimes", {})
    for dirpath, _, _ in sorted(os.walk(side.workdir), key=lambda t: -t[0].count("/")):
        if dirpath == side.workdir:
            continue
        rel = os.path.relpath(dirpath, side.workdir)
        m = dir_mtimes.get(rel, MTIME_BASE - 1000 - rel.count("/"))
        os.utime(dirpath, (m, m))


def tree(root):
    """Paths, kinds, modes and content digests under root, sorted."""
    out = []
    if not os.path.isdir(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            mode = oct(st.st_mode & 0o7777)
            if os.path.islink(p):
                out.append(f"{rel} link -> {os.readlink(p)}")
            elif os.path.isdir(p):
                out.append(f"{rel} dir {mode}")
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()[:16]
                out.append(f"{rel} file {mode} {st.st_size} {digest}")
            else:
                out.append(f"{rel} other {mode}")
    return out


# ---------------------------------------------------------------- running


def calls_json(side, case, repeat=1):
    calls = []
    for c in case["calls"]:
        if "raw" in c:
            text = c["raw"]
        else:
            text = json.dumps(c["input"], ensure_ascii=False)
        calls.append({"tool": c["tool"], "input": side.subst(text)})
    return json.dumps({"calls": calls, "call_timeout_ms": case.get("call_timeout_ms", 20_000),
                       "repeat": repeat})


def seq_timeout(case, repeat=1):
    # Every call is bounded by the program's per-call context; this bounds
    # the process around them (start-up, a wedged client) as a whole.
    return 15 + repeat * len(case["calls"]) * case.get("call_timeout_ms", 20_000) / 1000


def run_program(args, stdin, env, timeout, cwd):
    try:
        p = subprocess.run(args, input=stdin.encode(), capture_output=True, env=env,
                           timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f}s"
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
    return json.loads(p.stdout)["results"], None


def run_ref(refbin, side, case, env, repeat=1, start=None):
    cwd, env = (start.cwd, start.env) if start else (side.workdir, env)
    if start and start.removable:
        cwd = side.root
    return run_program([refbin, "ref", "--workdir", side.workdir], calls_json(side, case, repeat),
                       env, seq_timeout(case, repeat), cwd)


class Serve:
    """`agent-sidecar serve` on one side's directories, stopped by pid."""

    def __init__(self, runner, side, env, start=None, serve_args=()):
        self.side = side
        self.log = open(os.path.join(side.root, "serve.log"), "wb")
        self.proc = subprocess.Popen(
            [runner, "serve", "--workdir", side.workdir, "--socket", side.sock,
             "--state-dir", side.state, "--spill-dir", side.spill, *serve_args],
            env=start.env if start else env, cwd=start.cwd if start else side.workdir,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        if start:
            start.started()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent-sidecar serve exited {self.proc.returncode}")
            if os.path.exists(side.sock):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(side.sock)
                    return
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("agent-sidecar serve did not listen within 15s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        else:
            # The runner's own process group may keep background jobs.
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def run_runner(refbin, runner, side, case, env, repeat=1, start=None, serve_args=()):
    serve = Serve(runner, side, env, start, serve_args)
    try:
        return run_program([refbin, "runner", "--socket", side.sock],
                           calls_json(side, case, repeat), env, seq_timeout(case, repeat),
                           side.root)
    finally:
        serve.stop()


# ---------------------------------------------------------------- comparing


def view(res, side):
    if res.get("status"):
        return {"status": res["status"]}
    return {"content": side.normalise(res["content"]), "is_error": res["is_error"]}


def run_case(case, args, known, variant, parked):
    base = tempfile.mkdtemp(prefix="agentconf-")
    try:
        ref, run = Side(base, "ref"), Side(base, "run")
        home = os.path.join(base, "home")
        os.makedirs(home)
        env = clean_env(home)
        seed(ref, case)
        seed(run, case)
        ref_res, ref_err = run_ref(args.ref, ref, case, env, start=Start(variant, ref, env))
        try:
            run_res, run_err = run_runner(args.ref, args.runner, run, case, env,
                                          start=Start(variant, run, env),
                                          serve_args=() if parked else ("--no-parked-shell",))
        except RuntimeError as e:
            run_res, run_err = None, str(e)
        if ref_err or run_err:
            return {"id": case["id"], "outcome": "error",
                    "error": f"reference: {ref_err}" if ref_err else f"runner: {run_err}"}
        diffs = []
        for i, (a, b) in enumerate(zip(ref_res, run_res)):
            va, vb = view(a, ref), view(b, run)
            if va != vb:
                diffs.append({"call": i, "input": case["calls"][i], "reference": va, "runner": vb})
        if not case.get("skip_tree"):
            ta = [ref.normalise(x) for x in tree(ref.workdir)] + \
                 ["$OUTSIDE/" + ref.normalise(x) for x in tree(ref.outside)]
            tb = [run.normalise(x) for x in tree(run.workdir)] + \
                 ["$OUTSIDE/" + run.normalise(x) for x in tree(run.outside)]
            if ta != tb:
                diffs.append({"call": "tree", "reference": sorted(set(ta) - set(tb)),
                              "runner": sorted(set(tb) - set(ta))})
        entry = known.get(case["id"])
        if not diffs:
            outcome = "pass"
            if entry:
                outcome = "pass-but-listed"
        else:
            listed = set(entry["calls"]) if entry else set()
            unknown = [d for d in diffs if d["call"] not in listed
                       or not allowed(d, entry.get("allow"))]
            outcome = "fail" if unknown else "known"
        return {"id": case["id"], "outcome": outcome, "diffs": diffs,
                "divergence": entry_names(entry) if entry else None}
    finally:
        shutil.rmtree(base, ignore_errors=True)


# What a listed difference may be, when an entry narrows it ("allow"):
# each transform is applied to both sides' content, and what still differs
# is not known. Without "allow", any difference in a listed call is known.
ALLOW = {
    # The runner keeps a final newline the reference trims (Runner 2, and
    # grep's output as GNU grep prints it).
    "final-newline": lambda ref, run: (ref, run[:-1] if run.endswith("\n") else run),
    # NUL bytes are stripped from every runner result (seed, SanitizeText).
    "nul": lambda ref, run: (ref.replace("\x00", ""), run),
}


def allowed(diff, allow):
    if allow is None:
        return True
    a, b = diff["reference"], diff["runner"]
    if diff["call"] == "tree" or "content" not in a or "content" not in b:
        return False
    ref, run = a["content"], b["content"]
    for name in allow:
        ref, run = ALLOW[name](ref, run)
    return ref == run and a["is_error"] == b["is_error"]


def load_cases():
    cases = []
    for name in sorted(os.listdir(CASES_DIR)):
        if name.endswith(".json"):
            with open(os.path.join(CASES_DIR, name)) as f:
                for c in json.load(f):
                    c["file"] = name
                    cases.append(c)
    ids = [c["id"] for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"duplicate case ids: {sorted(dup)}")
    return cases


def entry_names(entry):
    return ", ".join(entry["entries"] if "entries" in entry else [entry["entry"]])


def load_known():
    with open(DIVERGENCES) as f:
        d = json.load(f)
    for cid, v in d["cases"].items():
        for name in v.get("entries", [v.get("entry")]):
            if name not in d["entries"]:
                sys.exit(f"divergences.json: case {cid} names unknown entry {name!r}")
        for name in v.get("allow") or []:
            if name not in ALLOW:
                sys.exit(f"divergences.json: case {cid} allows unknown difference {name!r}")
    return d["cases"]


def short(v, n=300):
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


def cmd_run(args):
    cases = load_cases()
    known = load_known()
    missing = sorted(set(known) - {c["id"] for c in cases})
    if missing:
        sys.exit(f"divergences.json names cases that do not exist: {missing}")
    if args.case:
        cases = [c for c in cases if c["id"] in args.case or c["file"] in args.case]
    deadline = time.monotonic() + args.deadline
    results = []
    runs = [(c, v, p) for c in cases for v in start_variant(c) for p in c.get("parked", [True])]
    for c, variant, parked in runs:
        label = c["id"]
        if "start_from" in c or "parked" in c:
            label += f"@{variant}" + ("" if parked else "/no-parked-shell")
        if time.monotonic() > deadline:
            results.append({"id": label, "outcome": "error", "error": "run deadline passed"})
            print(f"ERROR   {label}: run deadline passed", flush=True)
            continue
        t0 = time.monotonic()
        r = run_case(c, args, known, variant, parked)
        r["id"] = label
        r["seconds"] = round(time.monotonic() - t0, 2)
        results.append(r)
        tag = {"pass": "PASS", "known": "KNOWN", "fail": "FAIL", "error": "ERROR",
               "pass-but-listed": "PASS*"}[r["outcome"]]
        line = f"{tag:7} {label}"
        if r["outcome"] == "known":
            line += f"  [{r['divergence']}]"
        if r["outcome"] == "pass-but-listed":
            line += f"  (listed as {r['divergence']} but no difference)"
        if r["outcome"] == "error":
            line += f"  {r['error']}"
        print(line, flush=True)
        if r["outcome"] in ("fail", "known") and (args.verbose or r["outcome"] == "fail"):
            for d in r["diffs"]:
                mark = "" if r["outcome"] == "fail" else "(known) "
                print(f"        {mark}call {d['call']}: input {short(d.get('input'))}")
                print(f"          reference: {short(d['reference'])}")
                print(f"          runner:    {short(d['runner'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)
    passed = sum(r["outcome"] in ("pass", "known", "pass-but-listed") for r in results)
    failed = len(results) - passed
    n_known = sum(r["outcome"] == "known" for r in results)
    stale = [r["id"] for r in results if r["outcome"] == "pass-but-listed"]
    print(f"known divergences: {n_known} case(s) differ only where divergences.json says they do")
    if stale:
        print(f"listed in divergences.json but no longer different: {', '.join(stale)}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# ---------------------------------------------------------------- latency

BENCH = [
    ("bash", {"command": "true"}),
    ("read", {"file_path": "src/a.txt"}),
    ("write", {"file_path": "out/w.txt", "content": "hello\n" * 10}),
    ("edit", {"file_path": "src/e.txt", "old_string": "alpha", "new_string": "alpha", "replace_all": True}),
    ("glob", {"pattern": "**/*.txt"}),
    ("grep", {"pattern": "needle"}),
]


def cmd_bench(args):
    case = {
        "id": "bench",
        "seed": {"files": [
            {"path": "src/a.txt", "lines": 40},
            {"path": "src/e.txt", "lines": 40, "line": "alpha {n}"},
            {"path": "src/b.txt", "lines": 40, "line": "needle {n}"},
        ] + [{"path": f"d{i}/f{j}.txt", "lines": 5} for i in range(5) for j in range(4)]},
        "calls": [{"tool": t, "input": i} for t, i in BENCH],
        "call_timeout_ms": 20_000,
    }
    rows = {}
    for label in ("reference", "runner"):
        base = tempfile.mkdtemp(prefix="agentconf-", dir=args.dir)
        try:
            side = Side(base, "s")
            home = os.path.join(base, "home")
            os.makedirs(home)
            env = clean_env(home)
            seed(side, case)
            if label == "reference":
                res, err = run_ref(args.ref, side, case, env, repeat=args.iterations)
            else:
                res, err = run_runner(args.ref, args.runner, side, case, env, repeat=args.iterations)
            if err:
                sys.exit(f"{label}: {err}")
            for i, r in enumerate(res):
                tool = BENCH[i % len(BENCH)][0]
                if r.get("status") or r["is_error"]:
                    sys.exit(f"{label}: {tool} failed: {r}")
                if i // len(BENCH) >= args.warmup:
                    rows.setdefault(tool, {}).setdefault(label, []).append(r["ns"])
        finally:
            shutil.rmtree(base, ignore_errors=True)
    n = args.iterations - args.warmup
    print(f"| tool | reference (in-process Go) p50 | runner (gRPC, Unix socket) p50 | calls |")
    print("| --- | --- | --- | --- |")
    for tool, _ in BENCH:
        a = statistics.median(rows[tool]["reference"]) / 1000
        b = statistics.median(rows[tool]["runner"]) / 1000
        print(f"| {tool} | {fmt_us(a)} | {fmt_us(b)} | {n} |")
    return 0


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} us"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--ref", required=True, help="the reference program (reference/)")
        p.add_argument("--runner", required=True, help="the agent-sidecar binary")
    r = sub.choices["run"]
    r.add_argument("--case", action="append", help="only this case id or cases file (repeatable)")
    r.add_argument("--verbose", "-v", action="store_true", help="also show known differences")
    r.add_argument("--json", help="write every case's outcome and differences here")
    r.add_argument("--deadline", type=float, default=1200, help="seconds for the whole run")
    b = sub.choices["bench"]
    b.add_argument("--iterations", type=int, default=210)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--dir", default=None, help="where the bench directories go (default: $TMPDIR)")
    args = ap.parse_args()
    for p in (args.ref, args.runner):
        if not os.access(p, os.X_OK):
            sys.exit(f"not an executable: {p}")
    args.ref, args.runner = os.path.abspath(args.ref), os.path.abspath(args.runner)
    sys.exit(cmd_run(args) if args.cmd == "run" else cmd_bench(args))


if __name__ == "__main__":
    main()
