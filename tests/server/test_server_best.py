"""The best-schedule lookup: what the CLI (the engine's Tuner) stores, the service
serves, with ETag revalidation; and what a service job measures, the engine's
own lookup finds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from svc_helpers import EXAMPLES, SHAPE, wait_for

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status, Timing, TrialResult
from ws_tuner.server.middleware import BestLookupFastPath
from ws_tuner.server.schemas import BestPublic
from ws_tuner.store import Store
from ws_tuner.workload import Environment, WorkloadKey

H200 = Environment("sm_90a", "NVIDIA H200", "0.1.15", "12.8", "570.1")
PROBLEM = {"K": 4096, "M": 4096, "N": 4096, "b_layout": "row", "dtype": "float16"}


def _commit(store: Store, median_ms: float, i: int, env: Environment = H200, problem: dict | None = None,
            lowering: Lowering = Lowering.DEFAULT) -> Candidate:  # fmt: skip
    spec_hash = load_kernel(EXAMPLES / "gemm.py").source_hash
    workload = store.workload_id(WorkloadKey.make("gemm", spec_hash, problem or PROBLEM, env))
    params = {} if lowering is Lowering.REFERENCE else {"block_M": 128, "block_N": 256, "i": i}
    candidate = Candidate.make(params, None, lowering)
    timing = Timing(median_ms, median_ms * 0.99, median_ms * 1.01, 30)
    store.commit_trial(workload_id=workload, candidate=candidate, result=TrialResult(candidate.hash, Status.OK, timing=timing, tflops=100.0))
    return candidate


def test_best_lookup_with_etag(db_url: str, live_server: Callable, open_db: Callable) -> None:
    live = live_server(db_url)
    store = open_db(db_url)  # as the CLI writes: a store of its own
    _commit(store, 0.9, 1)
    fastest = _commit(store, 0.5, 2)
    _commit(store, 0.7, 3)
    _commit(store, 0.1, 4, env=Environment("sm_90a", "NVIDIA H100", "0.1.15", "12.8", "570.1"))  # another device
    _commit(store, 0.2, 5, problem={**PROBLEM, "dtype": "bfloat16"})  # another problem
    _commit(store, 0.05, 0, lowering=Lowering.REFERENCE)  # the vendor library: a baseline, never the answer
    params = {"kernel": "gemm", "problem": SHAPE, "device": "NVIDIA H200"}
    with live.client() as client:
        first = client.get("/best", params=params)
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["candidate_hash"] == fastest.hash and body["median_ms"] == 0.5 and body["problem"] == PROBLEM
        assert body["device"] == "NVIDIA H200" and body["workload"]["cuda_version"] == "12.8"
        etag = first.headers["etag"]
        assert etag.startswith('"') and first.headers["cache-control"] == "no-cache"

        # The same problem spelled differently (defaults explicit, JSON) is the same lookup.
        same = client.get("/best", params={**params, "problem": '{"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}'})
        assert same.headers["etag"] == etag

        not_modified = client.get("/best", params=params, headers={"If-None-Match": etag})
        assert not_modified.status_code == 304 and not_modified.content == b"" and not_modified.headers["etag"] == etag
        assert client.get("/best", params=params, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
        assert client.get("/best", params=params, headers={"If-None-Match": '"stale"'}).status_code == 200

        # A faster result: a new ETag (the cache is off in these tests).
        faster = _commit(store, 0.3, 6)
        changed = client.get("/best", params=params, headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.json()["candidate_hash"] == faster.hash
        assert changed.headers["etag"] != etag

        missing = client.get("/best", params={**params, "device": "NVIDIA B200"})
        assert missing.status_code == 404 and "no timed result for gemm" in missing.json()["detail"]
        bad = client.get("/best", params={**params, "problem": "M=4096"})
        assert bad.status_code == 422 and bad.json() == {"detail": "problem is missing K (give K=...,M=...,N=...)"}
        assert client.get("/best", params={"kernel": "gemm", "device": "x"}).json() == {"detail": "query.problem: Field required"}
        assert client.get("/best", params={**params, "kernel": "../x"}).status_code == 422


def test_best_answers_are_cached(db_url: str, live_server: Callable, open_db: Callable) -> None:
    live = live_server(db_url, best_cache_ttl=60.0)
    store = open_db(db_url)
    first = _commit(store, 0.5, 1)
    params = {"kernel": "gemm", "problem": SHAPE, "device": "NVIDIA H200"}
    with live.client() as client:
        assert client.get("/best", params=params).json()["candidate_hash"] == first.hash
        _commit(store, 0.1, 2)
        assert client.get("/best", params=params).json()["candidate_hash"] == first.hash  # served from memory
        live.services.best_cache.clear()
        assert client.get("/best", params=params).json()["candidate_hash"] != first.hash


def test_fast_path_and_stale_while_revalidate(db_url: str, live_server: Callable, open_db: Callable) -> None:
    live = live_server(db_url, best_cache_ttl=0.3)
    store = open_db(db_url)
    first = _commit(store, 0.5, 1)
    params = {"kernel": "gemm", "problem": SHAPE, "device": "NVIDIA H200"}
    with live.client() as client:
        routed = client.get("/best", params=params)  # through the route: validated, looked up, remembered
        served = client.get("/best", params=params)  # the same query string: from the fast path
        assert served.content == routed.content and served.headers["etag"] == routed.headers["etag"]
        assert served.headers["content-type"] == "application/json"
        assert client.get("/best", params=params, headers={"If-None-Match": routed.headers["etag"]}).status_code == 304
        newer = _commit(store, 0.2, 2)
        # Past the TTL the old answer may be served once more while it is refreshed; then the new one.
        wait_for(lambda: client.get("/best", params=params).json()["candidate_hash"] == newer.hash, 10, 0.05, "the refresh")
        assert first.hash != newer.hash


def test_authenticated_reads_on_the_fast_path(db_url: str, live_server: Callable, open_db: Callable, make_token: Callable) -> None:
    """When reads need a token, the fast path serves a remembered answer only to a
    token the route checked (within the token cache's time to live), without a query."""
    live = live_server(db_url, public_reads=False, best_cache_ttl=60.0, auth_cache_ttl=60.0)
    _commit(open_db(db_url), 0.5, 1)
    token = make_token(db_url, "read")
    params = {"kernel": "gemm", "problem": SHAPE, "device": "NVIDIA H200"}
    query = str(httpx.QueryParams(params)).encode()
    with live.client() as anonymous, live.client(token) as client, live.client("wst_" + "x" * 40) as forged:
        assert anonymous.get("/best", params=params).status_code == 401
        assert live.services.known_principal(token) is None  # not checked yet
        routed = client.get("/best", params=params)
        assert routed.status_code == 200 and live.services.known_principal(token) is not None
        assert live.services.fast_answer(query) is not None  # remembered for the fast path
        assert anonymous.get("/best", params=params).status_code == 401  # ...which never serves it without a token
        assert forged.get("/best", params=params).status_code == 401
        assert client.get("/best", params=params).content == routed.content

    # The middleware itself: a checked token is answered there (the app behind it is never called), any other passes through.
    passed: list[bytes | None] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        passed.append(dict(scope["headers"]).get(b"authorization"))

    async def call(authorization: bytes | None) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"authorization", authorization)] if authorization else []
        scope = {"type": "http", "method": "GET", "path": "/api/v1/best", "query_string": query, "headers": headers}
        await BestLookupFastPath(app, live.services, "/api/v1/best", need_token=True)(scope, None, send)
        return sent

    served = asyncio.run(call(f"bearer {token}".encode()))
    assert served[0]["status"] == 200 and served[1]["body"] == routed.content and passed == []
    for other in (None, b"Bearer wst_forged", f"Basic {token}".encode()):
        assert asyncio.run(call(other)) == [] and passed[-1] == other


def test_a_database_failure_on_the_fast_path_is_a_503(db_url: str, live_server: Callable, open_db: Callable) -> None:
    """The fast path runs in front of the app's error handlers: a store error there is
    answered as the route answers it (503 with Retry-After), not as an internal error."""
    live = live_server(db_url, best_cache_ttl=0.0)  # every lookup queries
    _commit(open_db(db_url), 0.5, 1)
    params = {"kernel": "gemm", "problem": SHAPE, "device": "NVIDIA H200"}
    query = str(httpx.QueryParams(params)).encode()
    with live.client() as client:
        assert client.get("/best", params=params).status_code == 200  # the route answers, and the fast path learns the query
        assert live.services.known_query(query) is not None
        live.services.store._best_query.close()  # the lookup's own connections: "the store is closed"
        if live.services.store._best_many is not None:
            live.services.store._best_many.close()
        failed = client.get("/best", params=params)
        assert failed.status_code == 503 and failed.headers["retry-after"] == "5", failed.text
        assert failed.json() == {"detail": "database unavailable; try again"}
        assert any("the store is closed" in line for line in live.log)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_real_kernel_job_is_served_and_reused_by_the_engine(
    db_url: str, live_server: Callable, make_token: Callable, worker_thread: Callable, open_db: Callable
) -> None:
    """examples/gemm.py, its real schedule space and tilelang's real verifier
    (VerifyOnlyBuilder), timed by the DummyRunner: the job's results are what
    the engine's Tuner reads back, and the Tuner's results what the job skips."""
    from ws_tuner import search
    from ws_tuner.task import Task
    from ws_tuner.testing import DummyRunner, VerifyOnlyBuilder
    from ws_tuner.tune import TuneOptions, Tuner

    store = open_db(db_url)
    spec = load_kernel(EXAMPLES / "gemm.py")
    pins = "block_K=64,split=square,swizzle=8"  # 32 of the 256 points: each is lowered by both sides, three times
    task = Task.make(spec, spec.parse_problem(SHAPE), spec.parse_params(pins))
    # The engine (as `ws-tune` does) measures 3 candidates first.
    cli = Tuner(task, store=store, builder=VerifyOnlyBuilder(), runner=DummyRunner(), strategy=search.create("random", seed=1),
                options=TuneOptions(budget=3, baselines=False, confirm_top=0)).run()  # fmt: skip
    cli_hashes = {r.candidate.hash for r in cli.records}
    assert len(cli_hashes) == 3

    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    worker_thread(db_url, dict(runner="dummy", builder="verify-only", space="kernel"))
    with live.client(token) as client:
        job = client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE, "params": pins, "budget": 4, "strategy": "random", "seed": 1}).json()
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] in ("succeeded", "failed") and j, 120)
        assert done["state"] == "succeeded", done
        assert done["workload_id"] == cli.workload_id  # one workload: same kernel hash, problem, device, toolchain
        trials = client.get(f"/jobs/{job['id']}/trials").json()["data"]
        job_hashes = {t["candidate_hash"] for t in trials}
        assert len(job_hashes) == 4 and not job_hashes & cli_hashes  # what the CLI measured is not measured again
        best = client.get("/best", params={"kernel": "gemm", "problem": SHAPE, "device": "Dummy H200 (test double)"}).json()
    assert best["gbps"] is None and all(t["gbps"] is None for t in trials)  # gemm.py says nothing of the bytes it moves
    stored = store.top_k(workload_id=cli.workload_id, k=100)
    assert len(stored) == 7 and best["candidate_hash"] == stored[0].candidate.hash
    assert best["tilelang"].startswith("T.annotate_ws_schedule(")
    # Built from the stored JSON, the answer is what the candidate itself says.
    assert best["candidate"] == stored[0].candidate.to_json() and best["tilelang"] == stored[0].candidate.schedule.to_source()
    assert BestPublic.model_validate(best).candidate_hash == stored[0].candidate.hash
    # ...and the engine resumes from the job's results: a re-run with budget 7 measures nothing.
    again = Tuner(task, store=store, builder=VerifyOnlyBuilder(), runner=DummyRunner(), strategy=search.create("random", seed=1),
                  options=TuneOptions(budget=7, baselines=False, confirm_top=0)).run()  # fmt: skip
    assert all(r.cached for r in again.records) and len(again.records) == 7


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_with_baselines_starts_from_tilelangs_default_structure(db_url: str, live_server: Callable, make_token: Callable,
                                                                     worker_thread: Callable, open_db: Callable, workers: int) -> None:  # fmt: skip
    """With its baselines, a job measures the schedule shaped as tilelang's default warp
    specialization, in a warm slot, once the seed schedule's baselines are in, at the seed's
    fastest points, and before its search (as the CLI does); with two workers, one waits
    while the other measures a seed, and the starts are queued once."""
    from ws_tuner.pipeline import BASELINE, TrialRecord, start_points
    from ws_tuner.task import Task

    spec = load_kernel(EXAMPLES / "gemm.py")
    pins = "block_K=64,block_M=128,consumers=cooperative,epilogue=direct,mma=sync,persistent=false,split=square"
    task = Task.make(spec, spec.parse_problem(SHAPE), spec.parse_params(pins))
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    for _ in range(workers):
        worker_thread(db_url, dict(runner="dummy", builder="verify-only", space="kernel", runner_delay=0.2 * (workers - 1)))
    with live.client(token) as client:
        body = {"kernel": "gemm", "problem": SHAPE, "params": pins, "budget": 2, "strategy": "random", "seed": 1, "baselines": True}
        job = client.post("/jobs", json=body).json()
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] in ("succeeded", "failed") and j, 120)
        assert done["state"] == "succeeded", done
        listed = client.get(f"/jobs/{job['id']}/trials", params={"limit": 100}).json()["data"]
        trials = {t["candidate_hash"]: t for t in listed}
    assert len(trials) == len(listed)  # each candidate once
    stored = open_db(db_url).trials_by_hash(workload_id=done["workload_id"]).values()
    points = task.measured_points(timed=True)
    baselines = [TrialRecord(t.candidate, t.result, t.result.info["role"]) for t in stored if t.result.info["role"] == BASELINE]
    chosen = start_points(baselines, task.seed_points(points))
    starts = {c.hash for c in task.lowering_starts(chosen)}
    elsewhere = {c.hash for c in task.lowering_starts(points)} - starts
    assert len(points) == 4 and len(chosen) == 3 and {trials[h]["kind"] for h in starts} == {"warm"} and not elsewhere & set(trials)
    seeds = [t for t in trials.values() if t["kind"] == "baseline" and t["lowering"] == "ws"]
    later = [t for t in trials.values() if t["kind"] != "baseline"]  # the starts, then the search
    assert len(seeds) == 4 and max(t["finished_at"] for t in seeds) <= min(t["created_at"] for t in later)


def test_best_schedule_by_url_reuses_one_store(db_url: str, open_db: Callable) -> None:
    """``best_schedule(path, db=URL)`` opens one store per URL for the process, not one per call."""
    from ws_tuner import lookup

    fastest = _commit(open_db(db_url), 0.5, 1)
    _commit(open_db(db_url), 0.7, 2)
    spec = load_kernel(EXAMPLES / "gemm.py")
    try:
        assert lookup.best_schedule(spec, SHAPE, db=db_url, env=H200) == fastest
        store = lookup.store_for(db_url)
        assert lookup.best_schedule(spec, SHAPE, db=db_url, env=H200) == fastest and lookup.store_for(db_url) is store
        assert lookup.store_for(store) is store
        faster = _commit(open_db(db_url), 0.2, 3)  # a new best in the same workload: found at once
        assert lookup.best_schedule(spec, SHAPE, db=db_url, env=H200) == faster
        other = Environment("sm_90a", "NVIDIA H200", "0.1.16", "12.8", "570.1")
        assert lookup.best_schedule(spec, SHAPE, db=db_url, env=other) is None  # no workload (yet)
        _commit(open_db(db_url), 0.9, 4, env=other)
        assert lookup.best_schedule(spec, SHAPE, db=db_url, env=other) is not None  # asked again, now found
    finally:
        with lookup._stores_lock:
            opened = lookup._stores.pop(lookup.resolve_db_url(db_url), None)
        if opened is not None:
            opened.close()


def test_a_miss_of_a_key_without_workloads_makes_no_query(db_url: str, open_db: Callable, tmp_path: Any) -> None:
    """The server keeps which workloads exist: a lookup of a problem nothing was tuned
    for is a 404 from memory, and a miss's explanation (compile-only results only,
    another device's) comes from there too."""
    from sqlalchemy import event
    from svc_helpers import fast_settings

    from ws_tuner.server.state import Services
    from ws_tuner.workload import COMPILE_ONLY_DEVICE

    store = open_db(db_url)
    untimed = Environment("sm_90a", COMPILE_ONLY_DEVICE, "0.1.15", "12.8", "none")
    store.workload_id(WorkloadKey.make("gemm", load_kernel(EXAMPLES / "gemm.py").source_hash, PROBLEM, untimed))
    services = Services(fast_settings(db_url, tmp_path, workload_directory_ttl=60.0), store)
    services.register_kernel_dirs()
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: statements.append(statement))
    try:
        services._lookup_best("gemm", "M=64,N=64,K=64", "NVIDIA H200", None)  # takes the snapshot (and the kernel's record)
        before = len(statements)
        absent = services._lookup_best("gemm", "M=128,N=128,K=128", "NVIDIA H200", None)
        assert absent.status == 404 and len(statements) == before, statements[before:]
        untimed_only = services._lookup_best("gemm", SHAPE, "NVIDIA H200", None)
        assert untimed_only.status == 404 and b"compile-only tunings" in untimed_only.body
    finally:
        services.close()


def test_lookups_under_load_never_wait_for_the_directory_or_the_kernel_registration(
    db_url: str, open_db: Callable, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload directory and a kernel's registration are fetched again in the
    background in the second half of their time to live, once for all lookups: under
    load neither lapses. A lapse sent every lookup in flight to the thread pool at once
    (32 threads and queries on two cores every few seconds: the p99 of uncached lookups)."""
    import time

    from svc_helpers import fast_settings

    from ws_tuner.server import state
    from ws_tuner.server.state import Services

    ttl = 1.0
    services = Services(fast_settings(db_url, tmp_path, workload_directory_ttl=ttl), open_db(db_url))
    services._kernels.ttl = ttl  # the registration's lifetime, shortened as the directory's
    hops: list[Any] = []
    real_hop = state.run_in_threadpool

    async def counted_hop(fn: Callable, *args: Any) -> Any:
        hops.append(fn)
        return await real_hop(fn, *args)

    async def lookups(n: int) -> set[int]:
        answers = await asyncio.gather(*(services.best_answer_async("gemm", "M=128,N=128,K=128", "NVIDIA H200", None) for _ in range(n)))
        return {a.status for a in answers}

    try:
        services.register_kernel_dirs()
        assert asyncio.run(lookups(1)) == {404}  # takes the snapshot and the registration
        monkeypatch.setattr(state, "run_in_threadpool", counted_hop)
        taken = services.workloads._taken_at
        for _ in range(4):  # past two lifetimes in all
            time.sleep(ttl * 0.6)
            assert asyncio.run(lookups(32)) == {404}
            wait_for(lambda: not services._refreshing, 5, 0.01, "the background refreshes")
        assert hops == []  # no lookup went to the thread pool
        assert services.workloads._taken_at > taken + ttl  # refreshed, more than once
    finally:
        services.close()


def test_a_token_in_use_is_checked_again_before_it_lapses(db_url: str, tmp_path: Any, open_db: Callable, make_token: Callable) -> None:
    """In the second half of its time to live a token in use is re-checked in the
    background: its entry never lapses under load (a lapse sent every request holding it
    through the full route at once), and a revoked one still lapses within the TTL."""
    import time

    from svc_helpers import fast_settings

    from ws_tuner.server.security import display_prefix
    from ws_tuner.server.state import Services
    from ws_tuner.store.registry import Registry

    ttl = 1.0
    token = make_token(db_url, "read")
    services = Services(fast_settings(db_url, tmp_path, auth_cache_ttl=ttl), open_db(db_url))
    try:
        assert services.authenticate(token) is not None and services.known_principal(token) is not None
        lapse = time.monotonic() + ttl
        time.sleep(ttl * 0.6)
        assert services.known_principal(token) is not None  # still fresh: and now re-checked behind the scenes
        wait_for(lambda: not services._refreshing, 5, 0.01, "the re-check")
        time.sleep(max(lapse - time.monotonic(), 0) + 0.1)
        assert services.known_principal(token) is not None  # past the first check's lapse: renewed

        Registry(open_db(db_url)).revoke_token(display_prefix(token))
        revoked = time.monotonic()
        wait_for(lambda: services.known_principal(token) is None, 3 * ttl, 0.02, "the revoked token to lapse")
        assert time.monotonic() - revoked <= 2 * ttl
    finally:
        services.close()


def _uploaded_job(client: Any, name: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """tests/data/NAME.py uploaded and a job on it (``body``, less the kernel) run to success:
    the upload's sha256 and the job's trials."""
    source = (Path(__file__).resolve().parents[1] / "data" / f"{name}.py").read_text()
    sha = client.post("/kernels", json={"name": name, "source": source}).json()["sha256"]
    job = client.post("/jobs", json={"kernel": name, "source_sha256": sha, **body}).json()
    done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] in ("succeeded", "failed") and j, 120)
    assert done["state"] == "succeeded", done
    return sha, client.get(f"/jobs/{job['id']}/trials", params={"limit": 100}).json()["data"]


def test_a_job_on_a_kernel_without_a_seed_measures_its_baselines(db_url: str, live_server: Callable, make_token: Callable,
                                                                worker_thread: Callable) -> None:  # fmt: skip
    """DeepSeek's mHC pre-mixing, uploaded: its warps split by hand at 96 and 160 threads,
    role_based gives no seed, so there is nothing to search; the job still measures
    tilelang's own lowerings, and succeeds."""
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write", "kernels:upload")
    worker_thread(db_url, dict(runner="dummy", builder="verify-only", space="kernel"))
    with live.client(token) as client:
        _, trials = _uploaded_job(client, "mhc_pre", {"problem": "tokens=1024", "budget": 2, "params": "hidden_block=256,num_stages=1",
                                                      "strategy": "random", "seed": 1, "baselines": True})  # fmt: skip
    kinds = sorted(t["kind"] for t in trials)
    assert kinds == ["baseline"] * 7, trials  # default, no_ws and role_based at 96 and 160 threads, and the file's reference
    assert sorted(t["lowering"] for t in trials) == ["default", "default", "no_ws", "no_ws", "reference", "role_based", "role_based"]


def test_a_job_on_a_kernel_that_says_what_it_moves_serves_gbps(db_url: str, live_server: Callable, make_token: Callable,
                                                               worker_thread: Callable) -> None:  # fmt: skip
    """rmsnorm, uploaded, says what a call moves (``bytes_moved``): the worker stores GB/s beside
    TFLOP/s, and the server, which never imports the file, serves them on the job's trials and
    its best. (A kernel that does not say serves None: the gemm job above.)"""
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write", "kernels:upload")
    worker_thread(db_url, dict(runner="dummy", builder="verify-only", space="kernel"))
    with live.client(token) as client:
        sha, trials = _uploaded_job(client, "rmsnorm", {"problem": "M=1024,N=1024", "budget": 2, "params": "blk_m=1,blk_k=512,num_stages=1,threads=128",
                                                        "strategy": "random", "seed": 1})  # fmt: skip
        trials = [t for t in trials if t["status"] == "ok"]
        # The server never parses an upload, so its defaults are not filled in: the problem in full.
        asked = {"kernel": "rmsnorm", "problem": "M=1024,N=1024,dtype=float16", "device": "Dummy H200 (test double)", "source_hash": sha}
        best = client.get("/best", params=asked).json()
    moved = 2.0 * (2 * 1024 * 1024 + 1024)  # the file's bytes_moved: x and y once each, the weight once
    assert trials and all(t["gbps"] == pytest.approx(moved / (t["median_ms"] * 1e-3) / 1e9) for t in trials), trials
    assert best["gbps"] == pytest.approx(moved / (best["median_ms"] * 1e-3) / 1e9) and best["tflops"] is not None
    assert BestPublic.model_validate(best).gbps == best["gbps"]
