"""Benchmark of the tuning service against a real `ws-tune serve` on loopback and PostgreSQL.

    python benchmarks/service_bench.py [--pg URL] [--clients 32] [--seconds 10] [--http-workers 1]

Prints:
  1. best-schedule lookups: requests/s and latency percentiles with 32 concurrent
     httpx async clients (each its own connection; spread over --client-procs
     processes, since one Python process of httpx clients saturates a core well
     below what the server serves), closed loop (each client sends its next
     request when the last one is answered), plain GETs and ETag revalidations
     (304); then open-loop runs at fixed offered rates (default 1,000 and 2,000
     req/s) over the same 32 clients, whose p99 is the latency a caller sees at
     that load;
  2. job submissions/s (POST /api/v1/jobs, authenticated, validated, stored);
  3. 8 workers x 500 trials through one job: exactly 500 terminal trials, no
     candidate twice (real `ws-tune worker` processes with the fast test
     doubles, sharing the job's Optuna study on the same PostgreSQL).

It creates a throw-away database on the server (CREATE DATABASE; dropped at the
end). Targets: lookups >= 1,000 req/s with p99 <= 10 ms at 32 clients;
submissions >= 200/s. The client runs on the same machine as the server and
competes with it for the CPU (on a 2-core machine, for half of it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = "M=4096,N=4096,K=4096"
DEVICE = "NVIDIA H200"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000  # noqa: E731
    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": ordered[-1] * 1000}


def seed(db_url: str) -> str:
    """Results as the CLI stores them, and a token; returns the token."""
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.kernel import load_kernel
    from ws_tuner.result import Status, Timing, TrialResult
    from ws_tuner.server.security import display_prefix, generate_token, hash_token
    from ws_tuner.store import Store
    from ws_tuner.store.registry import Registry
    from ws_tuner.workload import Environment, WorkloadKey

    store = Store(db_url)
    spec = load_kernel(ROOT / "examples" / "gemm.py")
    problem = spec.parse_problem(SHAPE)
    env = Environment("sm_90a", DEVICE, "0.1.15", "12.8", "570.1")
    workload = store.workload_id(WorkloadKey.make("gemm", spec.source_hash, problem, env))
    for i in range(200):
        c = Candidate.make({"block_M": 128, "block_N": 256, "i": i}, None, Lowering.DEFAULT)
        ms = 0.5 + (i * 7919 % 200) / 1000
        store.commit_trial(workload_id=workload, candidate=c, result=TrialResult(c.hash, Status.OK, timing=Timing(ms, ms, ms, 30), tflops=200.0))
    token = generate_token()
    Registry(store).add_token(name="bench", token_hash=hash_token(token), prefix=display_prefix(token), scopes=("jobs:write",))
    store.close()
    return token


def _client(base: str) -> httpx.AsyncClient:
    # One connection per client, as 32 separate callers have: one shared pool of 32
    # connections costs httpcore more CPU per request than the server spends on it.
    return httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=1), timeout=10, trust_env=False)


async def _closed(base: str, clients: int, seconds: float, headers: dict[str, str] | None) -> tuple[list[float], dict[int, int]]:
    params = {"kernel": "gemm", "problem": SHAPE, "device": DEVICE}
    latencies: list[float] = []
    codes: dict[int, int] = {}
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        async with _client(base) as client:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                r = await client.get("/best", params=params, headers=headers)
                latencies.append(time.perf_counter() - start)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

    await asyncio.gather(*(one() for _ in range(clients)))
    return latencies, codes


async def _open(base: str, clients: int, rate: float, seconds: float, offset: float) -> tuple[list[float], dict[int, int]]:
    """Requests start on a fixed schedule (``rate`` per second over these clients);
    latency counts from the scheduled start, so falling behind shows."""
    params = {"kernel": "gemm", "problem": SHAPE, "device": DEVICE}
    latencies: list[float] = []
    codes: dict[int, int] = {}
    interval = clients / rate  # each client's period
    pool = [_client(base) for _ in range(clients)]
    await asyncio.gather(*(c.get("/best", params=params) for c in pool))  # all connected before the clock starts
    t0 = time.perf_counter() + 0.5

    async def one(k: int, client: httpx.AsyncClient) -> None:
        i = 0
        while True:
            scheduled = t0 + i * interval + (k + offset) * interval / clients
            if scheduled > t0 + seconds:
                return
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            r = await client.get("/best", params=params)
            latencies.append(time.perf_counter() - scheduled)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            i += 1

    await asyncio.gather(*(one(k, c) for k, c in enumerate(pool)))
    for c in pool:
        await c.aclose()
    return latencies, codes


def _client_process(kind: str, base: str, clients: int, seconds: float, rate: float, offset: float,
                    headers: dict[str, str] | None) -> tuple[list[float], dict[int, int]]:  # fmt: skip
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if kind == "closed":
        return asyncio.run(_closed(base, clients, seconds, headers))
    return asyncio.run(_open(base, clients, rate, seconds, offset))


def lookups(kind: str, base: str, clients: int, procs: int, seconds: float, rate: float = 0.0,
            headers: dict[str, str] | None = None) -> tuple[int, list[float], dict[int, int]]:  # fmt: skip
    """``clients`` concurrent httpx async clients, spread over ``procs`` processes."""
    import multiprocessing

    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        parts = pool.starmap(_client_process, [
            (kind, base, n, seconds, rate * n / clients, i / procs, headers) for i, n in enumerate(per)])  # fmt: skip
    latencies = [x for lat, _ in parts for x in lat]
    codes: dict[int, int] = {}
    for _, c in parts:
        for k, v in c.items():
            codes[k] = codes.get(k, 0) + v
    return len(latencies), latencies, codes


async def submissions(base: str, token: str, clients: int, seconds: float) -> tuple[int, list[float], dict[int, int]]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    deadline = time.perf_counter() + seconds
    body = {"kernel": "gemm", "problem": SHAPE, "budget": 64, "strategy": "tpe"}
    auth = {"Authorization": f"Bearer {token}"}

    async def one(k: int) -> None:
        async with _client(base) as client:
            n = 0
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                r = await client.post("/jobs", json={**body, "seed": k * 100000 + n}, headers=auth)
                latencies.append(time.perf_counter() - start)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                n += 1

    await asyncio.gather(*(one(k) for k in range(clients)))
    return len(latencies), latencies, codes


def scale_check(db_url: str, workers: int, trials: int, strategy: str, tmp: Path) -> None:
    """On a database of its own: the jobs submitted above would otherwise be first in the queue."""
    from ws_tuner.server.kernels import problem_signature
    from ws_tuner.store import Store
    from ws_tuner.store.queue import JobQueue
    from ws_tuner.store.registry import Registry

    store = Store(db_url)
    queue = JobQueue(store)
    source = (ROOT / "examples" / "gemm.py").read_text()
    kernel = Registry(store).put_kernel("gemm", source, registered=True, problem=problem_signature(source))
    job = queue.create_job(kernel_id=kernel.id, kernel="gemm", problem={"M": 1, "tag": "scale"}, problem_checked=False,
                           params=None, strategy=strategy, seed=0, budget=trials)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_DB": db_url, "WS_TUNE_KERNEL_CACHE_DIR": str(tmp / "kc")}
    cmd = [sys.executable, "-m", "ws_tuner", "worker", "--runner", "dummy", "--builder", "fake", "--space", "fake",
           "--exit-when-idle", "--heartbeat", "1", "--grace", "20", "--poll", "0.1"]  # fmt: skip
    started = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
    try:
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    elapsed = time.perf_counter() - started
    done = queue.get_job(job.id)
    assert done is not None
    rows, count = queue.job_trials(job.id, limit=trials + 100)
    terminal = [r for r in rows if r.state in ("done", "failed", "cancelled")]
    distinct = len({r.candidate_hash for r in terminal})
    stored = sum(store.status_counts(workload_id=done.workload_id).values()) if done.workload_id else 0
    ok = done.state == "succeeded" and len(terminal) == trials == count == distinct == stored and codes == [0] * workers
    print(f"  {workers} workers x {trials} trials ({strategy}, shared Optuna study): {elapsed:.1f} s; job {done.state}; "
          f"{len(terminal)} terminal trials, {distinct} distinct candidates, {stored} stored results, "
          f"{len({r.worker_id for r in rows})} workers took part; worker exit codes {sorted(set(codes))} -> "
          f"{'OK: exactly ' + str(trials) if ok else 'FAILED'}")  # fmt: skip
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=os.environ.get("WS_TUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", type=float, nargs="*", default=[1000.0, 2000.0], help="offered loads of the open-loop lookup runs (req/s)")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the lookup clients are spread over")
    parser.add_argument("--http-workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--scale-workers", type=int, default=8)
    parser.add_argument("--scale-trials", type=int, default=500)
    parser.add_argument("--scale-strategy", default="random", choices=["random", "grid", "tpe"])
    args = parser.parse_args()

    # `timeout` and Ctrl-C: run the finally blocks (stop the server, drop the databases).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    name = f"ws_tune_bench_{uuid.uuid4().hex[:8]}"
    names = [name, name + "_scale"]
    with admin.connect() as c:
        for n in names:
            c.execute(text(f'CREATE DATABASE "{n}"'))
    db_url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
    scale_url = make_url(args.pg).set(database=names[1]).render_as_string(hide_password=False)
    tmp = Path(f"/tmp/{name}")
    tmp.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        token = seed(db_url)
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_BEST_CACHE_TTL": "1.0", "WS_TUNE_AUTH_CACHE_TTL": "2.0",
               "WS_TUNE_LOG_LEVEL": "warning"}  # fmt: skip
        server = subprocess.Popen(
            [sys.executable, "-m", "ws_tuner", "serve", "--db", db_url, "--port", str(port), "--workers", "0",
             "--http-workers", str(args.http_workers), "--kernel-dir", str(ROOT / "examples"), "--no-access-log"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.log", "wb"), start_new_session=True,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}/api/v1"
        for _ in range(200):
            try:
                if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit(f"server did not start: {(tmp / 'serve.log').read_text()[-2000:]}")
        first = httpx.get(f"{base}/best", params={"kernel": "gemm", "problem": SHAPE, "device": DEVICE})
        assert first.status_code == 200, first.text
        etag = first.headers["etag"]
        print(f"ws-tune service benchmark: PostgreSQL {make_url(args.pg).host}, uvicorn http workers {args.http_workers}, "
              f"{os.cpu_count()} CPU cores shared by server and client")  # fmt: skip

        print(f"1. best-schedule lookup, {args.clients} concurrent httpx async clients in {args.client_procs} process(es), "
              f"{args.seconds:.0f} s per run:")  # fmt: skip
        lookups("closed", base, args.clients, args.client_procs, 1.0)  # warm-up
        for label, headers in (("closed loop, GET (200)", None), ("closed loop, If-None-Match (304)", {"If-None-Match": etag})):
            n, lat, codes = lookups("closed", base, args.clients, args.client_procs, args.seconds, headers=headers)
            p = _percentiles(lat)
            print(f"  {label:34s} {n / args.seconds:7.0f} req/s  p50 {p['p50']:5.1f} ms  p90 {p['p90']:5.1f} ms  "
                  f"p99 {p['p99']:5.1f} ms  max {p['max']:6.1f} ms  {codes}")  # fmt: skip
        for rate in args.rates:
            n, lat, codes = lookups("open", base, args.clients, args.client_procs, args.seconds, rate=rate)
            p = _percentiles(lat)
            label = f"open loop, {rate:.0f} req/s offered"
            print(f"  {label:34s} {n / args.seconds:7.0f} req/s  p50 {p['p50']:5.1f} ms  p90 {p['p90']:5.1f} ms  "
                  f"p99 {p['p99']:5.1f} ms  max {p['max']:6.1f} ms  {codes}")  # fmt: skip

        print(f"2. job submission, {args.clients} concurrent clients, {args.seconds:.0f} s:")
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        n, lat, codes = asyncio.run(submissions(base, token, args.clients, args.seconds))
        p = _percentiles(lat)
        print(f"  POST /jobs {n / args.seconds:8.0f} submissions/s   p50 {p['p50']:.1f} ms  p99 {p['p99']:.1f} ms   statuses {codes}")

        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        server = None
        print(f"3. scale check ({args.scale_workers} worker processes, server stopped):")
        scale_check(scale_url, args.scale_workers, args.scale_trials, args.scale_strategy, tmp)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
        with admin.connect() as c:
            for n in names:
                c.execute(text(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
