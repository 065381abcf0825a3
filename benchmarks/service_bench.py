"""Speed of the tuning service, measured with wrk against a real `ws-tune serve`.

    python benchmarks/service_bench.py [--pg URL] [--connections 32] [--seconds 5] [--run NAME] [--only ROW...] [--profile]

wrk (C, one thread; installed here with apt-get when missing) drives each
server on loopback, so the load generator is not the bottleneck. In the same
run a minimal FastAPI app (one GET route, one POST route with a pydantic body)
is served under the same uvicorn settings (`uvicorn_options`): its req/s is the
ceiling every row is compared to. Server CPU per request is read from
/proc/<pid>/stat of the server process around each measured run.

Data: 50 workloads x 500 trials, and one workload of 100,000 trials (an
exhaustive run), on PostgreSQL (throw-away databases, dropped at the end) and
on SQLite files. Rows written to benchmarks/results/<run>/service.json:

  lookup-uncached-{pg,sqlite}        GET /best, answer cache off (every request queries)
  lookup-uncached-100k-{pg,sqlite}   the same on the 100,000-trial workload
  lookup-miss-pg                     GET /best of a problem with no results, cache off
  lookup-cached-pg                   GET /best, 1 s answer cache
  lookup-auth-pg                     GET /best with a bearer token (reads need one), 1 s caches
  submit-pg                          POST /jobs, authenticated, each with its own seed
  best-schedule-100k-{pg,sqlite}     in-process `best_trial` with a Store (calls/s, no ceiling)
  commit-trial-8w-{pg,sqlite}        `Store.commit_trial` from 8 worker processes together (trials/s, no ceiling)
  commit-trials-8w-{pg,sqlite}       the same with `Store.commit_trials` of 16 results a call (trials/s)

Targets (issue 11): uncached >= 0.5x the ceiling with p99 <= 20 ms; cached and
authenticated >= 2x with p99 <= 10 ms; submission >= 1,000/s; trial commits
>= 1,000/s from 8 workers; in-process p99 <= 1 ms on 100,000 trials.
"""

from __future__ import annotations

import argparse
from collections import Counter
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel
from sqlalchemy import create_engine, insert, make_url, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEVICE = "NVIDIA H200"
WORKLOADS, TRIALS, BIG = 50, 500, 100_000
PROBLEM = "M=4096,N=4096,K={k}"
BATCH = 16  # results a call in the commit-trials rows (a tournament's, a batch of baselines)
LOOKED_UP = 25  # the workload the 50 x 500 lookups ask for
BIG_PROBLEM = PROBLEM.format(k=8192)
CLK_TCK = os.sysconf("SC_CLK_TCK")

WRK_REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"socket_errors":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout))
end
"""
WRK_POST = """
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", nil, nil, string.format(wrk.body, n))
end
"""


@dataclass
class Row:
    name: str
    rps: float
    p99_ms: float
    ceiling_rps: float | None
    cpu_us_per_req: float | None
    p50_ms: float
    ratio: float | None
    requests: int
    non2xx: int


# --- set-up -------------------------------------------------------------------


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        if subprocess.run(sudo + cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            raise SystemExit(f"cannot install wrk ({' '.join(cmd)} failed); install the Debian package wrk")
    return shutil.which("wrk") or "wrk"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _candidates(n: int) -> list[Any]:
    """n distinct WS candidates of examples/gemm.py (its seed schedule, numbered params)."""
    from ws_tuner.candidate import Candidate
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    spec = load_kernel(ROOT / "examples" / "gemm.py")
    task = Task.make(spec, spec.parse_problem(PROBLEM.format(k=4096)))
    seed = task.space().seed_candidate(tuple(sorted({k: v[0] for k, v in spec.params.items()}.items())))
    assert not isinstance(seed, str), seed
    return [Candidate.make({**seed.param_dict, "variant": i}, seed.schedule) for i in range(n)]


def seed(db_url: str, workloads: int, trials: int, first_k: int) -> str:
    """``workloads`` workloads of ``trials`` timed trials each (a tenth failed, one
    reference lowering fastest of all), bulk-inserted; an API token; returns the token."""
    from ws_tuner.candidate import Candidate, Lowering, canonical_json
    from ws_tuner.kernel import load_kernel
    from ws_tuner.server.security import display_prefix, generate_token, hash_token
    from ws_tuner.store import Store
    from ws_tuner.store.models import CandidateModel, TrialModel, WorkloadModel
    from ws_tuner.store.registry import Registry
    from ws_tuner.workload import Environment, WorkloadKey

    store = Store(db_url)  # creates the schema
    spec = load_kernel(ROOT / "examples" / "gemm.py")
    env = Environment("sm_90a", DEVICE, "0.1.15", "12.8", "570.1")
    cands = [Candidate.make({"variant": -1}, None, Lowering.REFERENCE), *_candidates(trials - 1)]
    engine = create_engine(db_url)
    with engine.begin() as c:
        keys = [WorkloadKey.make("gemm", spec.source_hash, spec.parse_problem(PROBLEM.format(k=first_k + 64 * w)), env)
                for w in range(workloads)]  # fmt: skip
        c.execute(insert(WorkloadModel), [{"key_hash": k.hash, **k.to_json()} for k in keys])
        wids = dict(c.execute(text(f"SELECT key_hash, id FROM {WorkloadModel.__tablename__}")).all())
        rows = []
        for cand in cands:
            data = cand.to_json()
            rows.append({"hash": cand.hash, "lowering": data["lowering"], "params": canonical_json(data["params"]),
                         "schedule": canonical_json(data["schedule"]) if data["schedule"] else None})  # fmt: skip
        c.execute(insert(CandidateModel), rows)
        cids = dict(c.execute(text(f"SELECT hash, id FROM {CandidateModel.__tablename__}")).all())
        for w, key in enumerate(keys):
            batch = []
            for i, cand in enumerate(cands):
                failed = i % 10 == 9
                ms = None if failed else (0.3 if i == 0 else 0.5 + ((i * 7919 + w) % 100_003) / 100_000)
                batch.append({
                    "workload_id": wids[key.hash], "candidate_id": cids[cand.hash], "status": "failed" if failed else "ok",
                    "message": "", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "reps": None if failed else 30,
                    "tflops": None if failed else 200.0, "ratio": None if failed else ms / 0.4, "confirmed": False, "info": "{}",
                })  # fmt: skip
            c.execute(insert(TrialModel), batch)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM (ANALYZE)"))  # as after a bulk load: no autovacuum of it during a measurement
    engine.dispose()
    token = generate_token()
    Registry(store).add_token(name="bench", token_hash=hash_token(token), prefix=display_prefix(token), scopes=("jobs:write",))
    store.close()
    return token


# --- measuring ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def wrk(binary: str, url: str, *, seconds: float, connections: int, pid: int | None, headers: dict[str, str] | None = None,
        body: str | None = None, script_dir: Path) -> dict[str, Any]:  # fmt: skip
    script = script_dir / ("post.lua" if body else "get.lua")
    # A POST body is a format string: each request gets its own number (a job seed).
    prelude = f"wrk.method = 'POST'\nwrk.body = {json.dumps(body)}\n{WRK_POST}" if body else ""
    script.write_text(prelude + WRK_REPORT)
    cmd = [binary, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script)]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    before = cpu_seconds(pid) if pid else 0.0
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 60)
    after = cpu_seconds(pid) if pid else 0.0
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise SystemExit(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    report = json.loads(line.removeprefix("WRKJSON "))
    report["rps"] = report["requests"] / (report["duration_us"] / 1e6)
    report["cpu_us_per_req"] = (after - before) * 1e6 / report["requests"] if pid and report["requests"] else None
    return report


def profile(pid: int, seconds: float, raw: Path) -> subprocess.Popen:
    """py-spy sampling the server's GIL holder (its CPU, not its waits) while a row runs."""
    raw.parent.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # beside this interpreter in a venv
    cmd = [spy, "record", "-p", str(pid), "-d", str(max(1, int(seconds) - 1)), "-r", "250", "--gil", "-f", "raw", "-o", str(raw)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize_profile(raw: Path, out: Path, top: int = 60) -> None:
    """Each frame's share of the samples, with its callees (inclusive) and alone (self)."""
    inclusive: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        total += n
        inclusive.update({frame: n for frame in set(frames)})
        alone[frames[-1]] += n
    lines = [f"{total} samples (py-spy --gil)", "", "inclusive:"]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    lines += ["", "self:"] + [f"{100 * n / total:5.1f}%  {frame}" for frame, n in alone.most_common(top // 2)]
    out.write_text("\n".join(lines) + "\n")
    raw.unlink()


def row(name: str, report: dict[str, Any], ceiling: float | None) -> Row:
    r = Row(name=name, rps=round(report["rps"], 1), p99_ms=round(report["p99_us"] / 1000, 2), ceiling_rps=ceiling,
            cpu_us_per_req=round(report["cpu_us_per_req"], 1) if report["cpu_us_per_req"] is not None else None,
            p50_ms=round(report["p50_us"] / 1000, 2), ratio=round(report["rps"] / ceiling, 3) if ceiling else None,
            requests=report["requests"], non2xx=report["non2xx"])  # fmt: skip
    print(f"  {r.name:30s} {r.rps:9.0f} req/s  p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  "
          f"{'' if r.ratio is None else f'{r.ratio:5.2f}x ceiling'}  cpu {r.cpu_us_per_req} us/req  non-2xx {r.non2xx}",
          flush=True)  # fmt: skip
    return r


class Server:
    """A `ws-tune serve` (or the ceiling app) in its own session, stopped on exit."""

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, log: Path, ready: str) -> None:
        self.port, self.log = port, log
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True)
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"server did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def serve(db_url: str, tmp: Path, *, cache_ttl: float, public_reads: bool = True) -> Server:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_BEST_CACHE_TTL": str(cache_ttl), "WS_TUNE_AUTH_CACHE_TTL": "2.0",
           "WS_TUNE_LOG_LEVEL": "warning", "WS_TUNE_PUBLIC_READS": "true" if public_reads else "false"}  # fmt: skip
    cmd = [sys.executable, "-m", "ws_tuner", "serve", "--db", db_url, "--port", str(port), "--workers", "0",
           "--kernel-dir", str(ROOT / "examples"), "--no-access-log"]  # fmt: skip
    return Server(cmd, env, port, tmp / f"serve-{port}.log", "/api/v1/ready")


class Body(BaseModel):
    """The ceiling's POST body: the fields of the benchmark's job submissions."""

    kernel: str
    problem: str
    budget: int
    strategy: str
    seed: int


def ceiling_app() -> Any:
    """The minimal FastAPI app every figure is a ratio to."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/echo", status_code=201)
    async def echo(body: Body) -> dict[str, int]:
        return {"seed": body.seed}

    return app


def run_ceiling(port: int) -> None:
    import uvicorn

    from ws_tuner.server.config import Settings
    from ws_tuner.server.process import uvicorn_options

    settings = Settings(port=port, log_level="warning", access_log=False)
    uvicorn.Server(uvicorn.Config(ceiling_app(), **uvicorn_options(settings))).run()


def in_process(db_url: str, calls: int = 1000, seconds: float = 10.0) -> dict[str, Any]:
    """``best_trial`` on the 100,000-trial workload with one open Store (``calls``, or fewer in ``seconds``)."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.lookup import best_trial
    from ws_tuner.store import Store
    from ws_tuner.workload import Environment

    spec = load_kernel(ROOT / "examples" / "gemm.py")
    env = Environment("sm_90a", DEVICE, "0.1.15", "12.8", "570.1")
    with Store(db_url) as store:
        latencies: list[float] = []
        start_cpu, deadline = time.process_time(), time.perf_counter() + seconds
        while len(latencies) < calls and time.perf_counter() < deadline:
            t = time.perf_counter()
            found = best_trial(spec, BIG_PROBLEM, db=store, env=env)
            latencies.append(time.perf_counter() - t)
            assert found is not None and found.result.timing is not None
        cpu = time.process_time() - start_cpu
    latencies.sort()
    n, total = len(latencies), sum(latencies)
    return {"requests": n, "duration_us": total * 1e6, "rps": n / total, "p50_us": latencies[n // 2] * 1e6,
            "p99_us": latencies[int(n * 0.99)] * 1e6, "non2xx": 0, "cpu_us_per_req": cpu * 1e6 / n}  # fmt: skip


def _committer(db_url: str, worker: int, seconds: float, batch: int) -> list[float]:
    """One worker process: ``Store.commit_trial`` one after another for ``seconds`` (``batch`` > 1:
    ``Store.commit_trials`` of that many); the latency of each trial's commit."""
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.result import Status, Timing, TrialResult
    from ws_tuner.store import Store

    with Store(db_url) as store:
        workload = store.find_workloads()[0][0]
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            items = []
            for i in range(len(latencies), len(latencies) + batch):
                c = Candidate.make({"worker": worker, "i": i}, None, Lowering.DEFAULT)
                items.append((c, TrialResult(c.hash, Status.OK, timing=Timing(1.0, 1.0, 1.0, 30), tflops=100.0)))
            start = time.perf_counter()
            if batch == 1:
                store.commit_trial(workload_id=workload, candidate=items[0][0], result=items[0][1])
            else:
                store.commit_trials(workload_id=workload, items=items)
            latencies += [time.perf_counter() - start] * batch
    return latencies


def trial_commits(db_url: str, workers: int, seconds: float, batch: int = 1) -> dict[str, Any]:
    """``workers`` processes committing trials to one workload together (as tuning workers do)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        parts = pool.starmap(_committer, [(db_url, w, seconds, batch) for w in range(workers)])
    latencies = sorted(x for part in parts for x in part)
    n = len(latencies)
    return {"requests": n, "duration_us": seconds * 1e6, "rps": n / seconds, "p50_us": latencies[n // 2] * 1e6,
            "p99_us": latencies[int(n * 0.99)] * 1e6, "non2xx": 0, "cpu_us_per_req": None}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=os.environ.get("WS_TUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--run", default=f"service-{datetime.date.today().isoformat()}", help="results go to benchmarks/results/RUN/")
    parser.add_argument("--only", nargs="*", default=[], help="run only the rows whose names start so (the ceilings always run); "
                        "their rows replace those of the same names in the run's file")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="also record the server with py-spy (--gil: where its CPU goes) "
                        "during each measured row, to benchmarks/results/RUN/profile-ROW.txt (needs py-spy)")
    parser.add_argument("--ceiling", type=int, help=argparse.SUPPRESS)  # internal: serve the ceiling app on this port
    args = parser.parse_args()
    if args.ceiling:
        run_ceiling(args.ceiling)
        return 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop servers, drop databases
    binary = ensure_wrk()
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    name = f"ws_tune_bench_{uuid.uuid4().hex[:8]}"
    names = [name, name + "_big"]
    with admin.connect() as c:
        for n in names:
            c.execute(text(f'CREATE DATABASE "{n}"'))
    pg, pg_big = (make_url(args.pg).set(database=n).render_as_string(hide_password=False) for n in names)
    tmp = Path(tempfile.mkdtemp(prefix=name))
    lite, lite_big = f"sqlite:///{tmp / 'bench.db'}", f"sqlite:///{tmp / 'big.db'}"
    rows: list[Row] = []
    servers: list[Server] = []
    out_dir = ROOT / "benchmarks" / "results" / args.run
    measure = dict(seconds=args.seconds, connections=args.connections, script_dir=tmp)

    def want(*names: str) -> bool:
        """Whether to run any of these rows (the ceilings always run: every row is a ratio to them)."""
        return not args.only or any(n.startswith(("ceiling", *args.only)) for n in names)

    def bench(name: str, server: Server, path: str, ceiling: float | None, **kw: Any) -> None:
        if not want(name):
            return
        url = f"http://127.0.0.1:{server.port}{path}"
        wrk(binary, url, **{**measure, "seconds": 1.0}, pid=None, **kw)  # warm-up: connections, caches, JIT of the planner
        spy = profile(server.proc.pid, args.seconds, out_dir / f"profile-{name}.raw") if args.profile else None
        rows.append(row(name, wrk(binary, url, **measure, pid=server.proc.pid, **kw), ceiling))
        if spy is not None:
            spy.wait(60)
            summarize_profile(out_dir / f"profile-{name}.raw", out_dir / f"profile-{name}.txt")

    def start(server: Server) -> Server:
        servers.append(server)
        return server

    try:
        started = time.perf_counter()
        token = seed(pg, WORKLOADS, TRIALS, 4096)
        seed(lite, WORKLOADS, TRIALS, 4096)
        big = want(*(f"{kind}-100k-{db}" for kind in ("lookup-uncached", "best-schedule") for db in ("pg", "sqlite")))
        if big:
            seed(pg_big, 1, BIG, 8192)
            seed(lite_big, 1, BIG, 8192)
        print(f"ws-tune service benchmark: wrk -t1 -c{args.connections}, {args.seconds:g} s per run, {os.cpu_count()} CPU cores "
              f"shared by server and wrk; seeded in {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip

        port = _free_port()
        ceiling_cmd = [sys.executable, str(Path(__file__).resolve()), "--ceiling", str(port)]
        ceiling = start(Server(ceiling_cmd, {**os.environ, "PYTHONPATH": str(ROOT)}, port, tmp / "ceiling.log", "/ping"))
        body = json.dumps({"kernel": "gemm", "problem": PROBLEM.format(k=4096), "budget": 64, "strategy": "tpe", "seed": 0})
        body = body.replace('"seed": 0', '"seed": %d')
        post = {"Content-Type": "application/json"}
        bench("ceiling-get", ceiling, "/ping", None)
        bench("ceiling-post", ceiling, "/echo", None, body=body, headers=post)
        get_ceiling, post_ceiling = rows[0].rps, rows[1].rps
        ceiling.stop()

        def best(problem: str) -> str:
            return "/api/v1/best?" + urlencode({"kernel": "gemm", "problem": problem, "device": DEVICE})

        hit, miss = best(PROBLEM.format(k=4096 + 64 * LOOKED_UP)), best("M=1,N=1,K=1")
        for label, db in (("pg", pg), ("sqlite", lite)):
            if not want(f"lookup-uncached-{label}", f"lookup-miss-{label}"):
                continue
            server = start(serve(db, tmp, cache_ttl=0.0))
            assert httpx.get(f"http://127.0.0.1:{server.port}{hit}").status_code == 200
            bench(f"lookup-uncached-{label}", server, hit, get_ceiling)
            if label == "pg":
                bench("lookup-miss-pg", server, miss, get_ceiling)
            server.stop()
        for label, db in (("pg", pg_big), ("sqlite", lite_big)):
            if not want(f"lookup-uncached-100k-{label}"):
                continue
            server = start(serve(db, tmp, cache_ttl=0.0))
            bench(f"lookup-uncached-100k-{label}", server, best(BIG_PROBLEM), get_ceiling)
            server.stop()

        server = start(serve(pg, tmp, cache_ttl=1.0)) if want("lookup-cached-pg", "submit-pg") else None
        if server:
            bench("lookup-cached-pg", server, hit, get_ceiling)
            bench("submit-pg", server, "/api/v1/jobs", post_ceiling, body=body, headers={"Authorization": f"Bearer {token}", **post})
            server.stop()
        if want("lookup-auth-pg"):
            server = start(serve(pg, tmp, cache_ttl=1.0, public_reads=False))
            assert httpx.get(f"http://127.0.0.1:{server.port}{hit}").status_code == 401
            bench("lookup-auth-pg", server, hit, get_ceiling, headers={"Authorization": f"Bearer {token}"})
            server.stop()
        for label, db in (("pg", pg_big), ("sqlite", lite_big)):
            if want(f"best-schedule-100k-{label}"):
                rows.append(row(f"best-schedule-100k-{label}", in_process(db), None))
        for label, db in (("pg", pg), ("sqlite", lite)):
            if want(f"commit-trial-8w-{label}"):
                rows.append(row(f"commit-trial-8w-{label}", trial_commits(db, 8, args.seconds), None))
            if want(f"commit-trials-8w-{label}"):
                rows.append(row(f"commit-trials-8w-{label}", trial_commits(db, 8, args.seconds, BATCH), None))
    finally:
        for server in servers:
            server.stop()
        with admin.connect() as c:
            for n in names:
                c.execute(text(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(tmp, ignore_errors=True)

    out = out_dir / "service.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = {r.name: asdict(r) for r in rows}
    kept = [r for r in json.loads(out.read_text()) if r["name"] not in fresh] if args.only and out.exists() else []
    out.write_text(json.dumps(kept + list(fresh.values()), indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
