"""The jobs API against a real uvicorn server, on SQLite and PostgreSQL: submit,
list, progress, trials, cancel; authentication and scopes; bad input is a 4xx
with one clear message and writes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

import httpx
import pytest
from svc_helpers import FAKE, SHAPE, wait_for

from ws_tuner.store.queue import JobQueue

GOOD = {"kernel": "gemm", "problem": SHAPE, "budget": 12, "strategy": "random"}


def _counts(live: Any) -> tuple[int, int]:
    """(jobs, kernel sources) in the database: what a refused request must not change."""
    jobs = live.services.queue.list_jobs(limit=1)[1]
    kernels = live.services.registry.list_kernels(limit=1)[1]
    return jobs, kernels


def test_submit_run_and_inspect_a_job(db_url: str, live_server: Callable, make_token: Callable, worker_thread: Callable) -> None:
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    with live.client(token) as client:
        created = client.post("/jobs", json=GOOD)
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["state"] == "queued" and job["problem"] == {"K": 4096, "M": 4096, "N": 4096, "b_layout": "row", "dtype": "float16"}
        assert job["problem_checked"] and job["progress"]["budget"] == 12 and job["progress"]["fraction"] == 0.0
        worker = worker_thread(db_url)
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] == "succeeded" and j, 30, what="the job")
        none = {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}
        assert done["progress"] == {"budget": 12, "claimed": 12, **none, "done": 12, "fraction": 1.0, "baselines": none}
        assert done["device"] == "Dummy H200 (test double)" and done["workload_id"] is not None
        assert done["best"]["median_ms"] > 0 and len(done["best"]["candidate_hash"]) == 20

        trials = client.get(f"/jobs/{job['id']}/trials", params={"limit": 5}).json()
        assert trials["count"] == 12 and len(trials["data"]) == 5
        assert {t["state"] for t in trials["data"]} == {"done"} and [t["slot"] for t in trials["data"]] == [0, 1, 2, 3, 4]
        for t in trials["data"]:  # what each trial was, and how it fared
            assert t["lowering"] == "default" and t["params"] and t["schedule"] is None and t["status"] == "ok"
            assert t["timing"]["median_ms"] == t["median_ms"] > 0 and t["timing"]["reps"] > 0 and t["kind"] == "search"
        hashes = {t["candidate_hash"] for t in client.get(f"/jobs/{job['id']}/trials", params={"limit": 500}).json()["data"]}
        assert len(hashes) == 12  # no candidate measured twice

        listed = client.get("/jobs", params={"state": "succeeded"}).json()
        assert listed["count"] == 1 and listed["data"][0]["id"] == job["id"]
        assert client.get("/jobs", params={"state": "queued"}).json() == {"data": [], "count": 0}
        # alive: a heartbeat within the 1.5 s grace, which a loaded CI machine can miss once (CI of stop 51)
        workers = wait_for(lambda: (w := client.get("/workers", params={"alive": True}).json())["count"] == 1 and w, 10, what="the worker's heartbeat")
        assert workers["data"][0]["id"] == worker.worker.id
        ready = wait_for(lambda: (r := client.get("/ready").json())["workers_alive"] == 1 and r, 10, what="the worker's heartbeat")
        assert ready["status"] == "ready" and ready["schema_revision"] == "v0.3.0.c"
    worker.stop()


def test_cancel(db_url: str, live_server: Callable, make_token: Callable) -> None:
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    with live.client(token) as client:
        job = client.post("/jobs", json=GOOD).json()
        cancelled = client.post(f"/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        again = client.post(f"/jobs/{job['id']}/cancel")
        assert again.status_code == 409 and again.json() == {"detail": f"job {job['id']} is already cancelled"}
        assert client.post("/jobs/999999/cancel").status_code == 404
        assert client.get("/jobs/999999").json() == {"detail": "job 999999 not found"}
        assert client.get("/jobs/999999/trials").status_code == 404
    # A cancelled job is never claimed.
    assert JobQueue(live.services.store).claim_job("w", "dev") is None


def test_auth_and_scopes(db_url: str, live_server: Callable, make_token: Callable) -> None:
    live = live_server(db_url)
    reader = make_token(db_url, "read")
    writer = make_token(db_url, "jobs:write")
    uploader = make_token(db_url, "jobs:write", "kernels:upload")
    source = "PROBLEM = {'M': None}\nPARAMS = {}\n"
    with live.client() as anonymous:
        response = anonymous.post("/jobs", json=GOOD)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {"detail": "missing bearer token (Authorization: Bearer <token>)"}
        assert anonymous.post("/jobs", json=GOOD, headers={"Authorization": "Bearer wst_nope"}).status_code == 401
        assert anonymous.post("/jobs", json=GOOD, headers={"Authorization": "Basic abc"}).status_code == 401
        assert anonymous.post("/jobs/1/cancel").status_code == 401
        assert anonymous.post("/kernels", json={"name": "k", "source": source}).status_code == 401
        assert anonymous.get("/jobs").status_code == 200  # reads are public by default
    with live.client(reader) as client:
        denied = client.post("/jobs", json=GOOD)
        assert denied.status_code == 403 and denied.json() == {"detail": "this token lacks the 'jobs:write' scope"}
    with live.client(writer) as client:
        # Uploading source is code the workers will run: its own scope.
        upload = client.post("/jobs", json={**GOOD, "kernel": "mine", "source": source, "problem": "M=64"})
        assert upload.status_code == 403 and "kernels:upload" in upload.json()["detail"]
        assert client.post("/kernels", json={"name": "mine", "source": source}).status_code == 403
        assert client.post("/jobs", json=GOOD).status_code == 201
    with live.client(uploader) as client:
        response = client.post("/jobs", json={**GOOD, "kernel": "mine", "source": source, "problem": "M=64"})
        assert response.status_code == 201, response.text
        job = response.json()
        assert job["problem"] == {"M": 64} and job["problem_checked"] is False  # uploads: syntax only
        kernel = client.post("/kernels", json={"name": "other", "source": source + "# v2\n"})
        assert kernel.status_code == 201 and kernel.json()["registered"] is False
        by_hash = client.post("/jobs", json={**GOOD, "kernel": "other", "source_sha256": kernel.json()["sha256"], "problem": "M=8"})
        assert by_hash.status_code == 201 and by_hash.json()["kernel_sha256"] == kernel.json()["sha256"]
    # Revocation takes effect (the auth cache is off in these tests).
    from ws_tuner.store.registry import Registry

    prefix = next(t.prefix for t in Registry(live.services.store).list_tokens() if t.scopes == ("jobs:write",))
    assert Registry(live.services.store).revoke_token(prefix) == 1
    with live.client(writer) as client:
        assert client.post("/jobs", json=GOOD).json() == {"detail": "invalid or revoked token"}


def test_private_reads(db_url: str, live_server: Callable, make_token: Callable) -> None:
    live = live_server(db_url, public_reads=False)
    token = make_token(db_url, "read")
    with live.client() as anonymous:
        assert anonymous.get("/jobs").status_code == 401
        assert anonymous.get("/health").status_code == 200  # probes stay open
    with live.client(token) as client:
        assert client.get("/jobs").status_code == 200


BAD: list[tuple[str, Any, int, str]] = [
    ("malformed JSON", b'{"kernel": "gemm", "problem": ', 400, "malformed JSON body"),
    ("not an object", b"[1, 2]", 422, "Input should be a valid dictionary"),
    ("no body", b"", 422, "Field required"),
    ("unknown field", {**GOOD, "budgett": 3}, 422, "budgett: Extra inputs are not permitted"),
    ("unknown kernel", {**GOOD, "kernel": "nope"}, 422, "unknown kernel 'nope'"),
    ("kernel name", {**GOOD, "kernel": "../etc/passwd"}, 422, "kernel: String should match pattern"),
    ("missing dimension", {**GOOD, "problem": "M=4096,N=4096"}, 422, "problem is missing K"),
    ("not a number", {**GOOD, "problem": "M=4096,N=lots,K=4096"}, 422, "N='lots' is not a number"),
    ("unknown argument", {**GOOD, "problem": SHAPE + ",Q=1"}, 422, "unknown problem argument 'Q'"),
    ("bad choice", {**GOOD, "problem": SHAPE + ",dtype=int3"}, 422, "dtype=int3 is not one of float16, bfloat16"),
    ("negative size", {**GOOD, "problem": "M=-4096,N=4096,K=4096"}, 422, "M must be positive"),
    ("float size", {**GOOD, "problem": {"M": 4096.5, "N": 4096, "K": 4096}}, 422, "is not a number"),
    ("syntax", {**GOOD, "problem": "M4096"}, 422, "problem wants KEY=VALUE pairs"),
    ("empty problem", {**GOOD, "problem": ""}, 422, "problem"),
    ("NUL", {**GOOD, "problem": "M=1\x00"}, 422, "NUL"),
    ("lone surrogate", b'{"kernel": "gemm", "problem": "M=\\ud800", "budget": 3}', 422, "unicode string"),
    ("zero budget", {**GOOD, "budget": 0}, 422, "budget: Input should be greater than or equal to 1"),
    ("negative budget", {**GOOD, "budget": -5}, 422, "budget"),
    ("huge budget", {**GOOD, "budget": 10**12}, 422, "budget"),
    ("fractional budget", {**GOOD, "budget": 2.5}, 422, "budget"),
    ("string budget", {**GOOD, "budget": "lots"}, 422, "budget"),
    ("over the server's limit", {**GOOD, "budget": 5000}, 422, "exceeds this server's limit of 1000"),
    ("negative time budget", {**GOOD, "time_budget": -1}, 422, "time_budget"),
    ("strategy", {**GOOD, "strategy": "annealing"}, 422, "strategy"),
    ("unknown pinned parameter", {**GOOD, "params": "block_Q=1"}, 422, "unknown kernel parameter 'block_Q'"),
    ("source and hash", {**GOOD, "source": "x = 1\n", "source_sha256": "0" * 64}, 422, "not both"),
    ("unknown hash", {**GOOD, "source_sha256": "0" * 64}, 422, "no kernel source with sha256"),
    ("source syntax", {**GOOD, "kernel": "mine", "source": "def broken(:\n"}, 422, "kernel source does not parse: line 1"),
]


@pytest.mark.parametrize("auth_cache_ttl", [0.0, 60.0], ids=["routed", "fast-path"])
def test_bad_input_is_a_clear_4xx_and_writes_nothing(db_url: str, live_server: Callable, make_token: Callable, auth_cache_ttl: float) -> None:
    """Routed, and through the submission fast path (a token the cache knows): the same answers."""
    live = live_server(db_url, max_budget=1000, auth_cache_ttl=auth_cache_ttl)
    token = make_token(db_url, "jobs:write", "kernels:upload")
    before = _counts(live)
    failures = []
    with live.client(token) as client:
        assert client.post("/jobs/999999/cancel").status_code == 404  # the token checked (and remembered, with the cache on)
        assert (live.services.known_principal(token) is not None) == (auth_cache_ttl > 0)
        for case, body, status, needle in BAD:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = client.post("/jobs", content=content, headers={"content-type": "application/json"})
            detail = response.json().get("detail") if response.headers.get("content-type") == "application/json" else None
            if response.status_code != status or not isinstance(detail, str) or "\n" in detail or needle not in detail:
                failures.append((case, response.status_code, response.text))
    assert not failures, failures
    assert _counts(live) == before  # nothing written by any of them


def test_submission_fast_path(db_url: str, live_server: Callable, make_token: Callable) -> None:
    """A submission from a token the cache knows skips FastAPI's routing, dependencies and
    validation (middleware.SubmitFastPath), and answers as the route does."""
    live = live_server(db_url, auth_cache_ttl=60.0)
    writer, reader = make_token(db_url, "jobs:write"), make_token(db_url, "read")
    with live.client(writer) as client:
        routed = client.post("/jobs", json=GOOD)  # the token's first check: through the route
        assert routed.status_code == 201 and live.services.known_principal(writer) is not None
        fast = client.post("/jobs", json={**GOOD, "seed": 7})
        assert fast.status_code == 201 and fast.headers["content-type"] == "application/json"
        first, second = routed.json(), fast.json()
        assert second["id"] == first["id"] + 1 and second["seed"] == 7
        assert {k: v for k, v in second.items() if k not in ("id", "seed", "created_at", "updated_at")} == \
            {k: v for k, v in first.items() if k not in ("id", "seed", "created_at", "updated_at")}  # fmt: skip
        assert client.get(f"/jobs/{second['id']}").json()["seed"] == 7
        upload = client.post("/jobs", json={**GOOD, "kernel": "mine", "source": "x = 1\n", "problem": "M=64"})
        assert upload.status_code == 403 and "kernels:upload" in upload.json()["detail"]  # raised inside the route's work
    with live.client(reader) as client:
        assert client.post("/jobs/999999/cancel").status_code == 403 and live.services.known_principal(reader) is not None
        assert client.post("/jobs", json=GOOD).json() == {"detail": "this token lacks the 'jobs:write' scope"}

    # The middleware itself: what it answers never reaches the app behind it; anything else does, body intact.
    from ws_tuner.server.middleware import SubmitFastPath
    from ws_tuner.server.schemas import JobCreate
    from fastapi import HTTPException

    passed: list[bytes] = []
    handled: list[Any] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while (message := await receive()).get("more_body"):
            body += message["body"]
        passed.append(body + message["body"])

    async def handle(body: Any, *, principal: Any) -> Any:
        handled.append((body, principal.name))
        if body.budget == 13:
            raise HTTPException(422, "unlucky", headers={"X-Why": "13"})
        from fastapi.responses import Response

        return Response(b"{}", status_code=201, media_type="application/json")

    async def call(body: bytes, token: str, content_type: bytes = b"application/json") -> list[dict]:
        sent: list[dict] = []
        messages = [{"type": "http.request", "body": body[:5], "more_body": True}, {"type": "http.request", "body": body[5:]}]

        async def receive() -> dict:
            return messages.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"authorization", f"Bearer {token}".encode()), (b"content-type", content_type)]
        scope = {"type": "http", "method": "POST", "path": "/api/v1/jobs", "headers": headers}
        fast_path = SubmitFastPath(app, path="/api/v1/jobs", services=live.services, model=JobCreate, scope="jobs:write", handle=handle)
        await fast_path(scope, receive, send)
        return sent

    good = json.dumps(GOOD).encode()
    assert asyncio.run(call(good, writer))[0]["status"] == 201 and passed == [] and handled[-1][1] == "test"
    refused = asyncio.run(call(json.dumps({**GOOD, "budget": 13}).encode(), writer))
    assert refused[0]["status"] == 422 and (b"x-why", b"13") in refused[0]["headers"]
    assert json.loads(refused[1]["body"]) == {"detail": "unlucky"} and passed == []
    for body, token, content_type in [(b'{"kernel": ', writer, b"application/json"), (json.dumps({**GOOD, "budget": "9"}).encode(), writer, b"application/json"),
                                      (good, reader, b"application/json"), (good, "wst_forged", b"application/json"), (good, writer, b"text/plain")]:  # fmt: skip
        assert asyncio.run(call(body, token, content_type)) == [] and passed[-1] == body
    assert len(handled) == 2


def test_oversized_bodies_get_413(db_url: str, live_server: Callable, make_token: Callable) -> None:
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write", "kernels:upload")
    before = _counts(live)
    big = "# " + "x" * (1024 * 1024) + "\n"
    with live.client(token) as client:
        response = client.post("/kernels", json={"name": "huge", "source": big})
        assert response.status_code == 413 and response.json() == {"detail": "request body exceeds 1048576 bytes"}
        response = client.post("/jobs", json={**GOOD, "kernel": "huge", "source": big})
        assert response.status_code == 413

        def chunks():  # no Content-Length: the limit holds for streamed bodies too
            for _ in range(40):
                yield b"x" * 65536

        response = client.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413
    assert _counts(live) == before


def test_openapi_and_docs(db_url: str, live_server: Callable) -> None:
    live = live_server(db_url)
    with httpx.Client(base_url=live.url) as client:
        spec = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/trials", "/api/v1/jobs/{job_id}/cancel",
            "/api/v1/best", "/api/v1/kernels", "/api/v1/health", "/api/v1/ready"} <= set(spec["paths"])  # fmt: skip
    assert spec["paths"]["/api/v1/jobs"]["post"]["operationId"] == "jobs-create_job"
    assert spec["paths"]["/api/v1/jobs"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/api/v1/jobs"]["get"]  # public reads


def test_a_job_s_time_budget_is_its_search_s_clock(db_url: str, live_server: Callable, make_token: Callable, worker_thread: Callable) -> None:
    """The baselines take 2 x 1.5 s, longer than the whole time budget: they are measured,
    and the search still gets its second after them (the CLI's clock, Pipeline.run)."""
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    worker_thread(db_url, stages={**FAKE, "runner_delay": 1.5})
    with live.client(token) as client:
        job = client.post("/jobs", json={**GOOD, "budget": 100000, "baselines": True, "time_budget": 1.0}).json()
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] == "succeeded" and j, 60)
        trials = client.get(f"/jobs/{job['id']}/trials").json()["data"]
    assert done["progress"]["baselines"]["done"] == 2
    assert 1 <= sum(t["kind"] == "search" for t in trials) <= 3  # 1.5 s each: the clock ends it after one or two


def test_baselines_time_budget_and_cancel_with_a_worker(
    db_url: str, live_server: Callable, make_token: Callable, worker_thread: Callable
) -> None:
    from collections import Counter

    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    worker_thread(db_url)
    with live.client(token) as client:
        def finished(job_id: int) -> Any:
            return wait_for(lambda: (j := client.get(f"/jobs/{job_id}").json())["state"] in ("succeeded", "cancelled") and j, 60)

        # Baselines come on top of the search budget.
        job = client.post("/jobs", json={**GOOD, "budget": 6, "baselines": True}).json()
        done = finished(job["id"])
        trials = client.get(f"/jobs/{job['id']}/trials").json()["data"]
        kinds = Counter(t["kind"] for t in trials)
        assert kinds == {"search": 6, "baseline": 2} and done["progress"]["claimed"] == 6
        assert done["progress"]["done"] == 6 == done["progress"]["budget"] and done["progress"]["baselines"]["done"] == 2
        # The search's best, not a baseline's (six samples need not beat the baselines' 1 ms).
        assert done["best"]["candidate_hash"] in {t["candidate_hash"] for t in trials if t["kind"] == "search"}

        # A time budget stops claiming; the job still ends "succeeded", with what it measured.
        timed = client.post("/jobs", json={**GOOD, "budget": 100000, "time_budget": 2.0}).json()
        done = finished(timed["id"])
        assert done["state"] == "succeeded" and 0 < done["progress"]["claimed"] < 100000
        assert done["progress"]["done"] == done["progress"]["claimed"]

        # Cancelling a running job: what is in flight finishes, nothing new is claimed.
        big = client.post("/jobs", json={**GOOD, "budget": 100000}).json()
        wait_for(lambda: client.get(f"/jobs/{big['id']}").json()["progress"]["done"] >= 5, 30)
        assert client.post(f"/jobs/{big['id']}/cancel").json()["state"] == "cancelled"
        settled = wait_for(lambda: (j := client.get(f"/jobs/{big['id']}").json())["progress"]["running"] == 0 and j, 30)
        time.sleep(0.5)
        again = client.get(f"/jobs/{big['id']}").json()
        assert again["state"] == "cancelled" and again["progress"]["claimed"] == settled["progress"]["claimed"] < 100000


def test_a_job_is_measured_beside_an_anchor_and_ends_with_its_final_tournament(
    db_url: str, live_server: Callable, make_token: Callable, worker_thread: Callable, open_db: Callable
) -> None:
    """The service drives the CLI's pipeline: every timing beside the job's anchor,
    ranks by the ratio to it, and the leaders confirmed side by side at the end."""
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    worker = worker_thread(db_url)
    with live.client(token) as client:
        job = client.post("/jobs", json={**GOOD, "budget": 10, "baselines": True}).json()
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] == "succeeded" and j, 60)
        store = open_db(db_url)
        # The tournament follows the job's completion: wait for its results.
        trials = wait_for(lambda: (t := store.trials_by_hash(workload_id=done["workload_id"])) and any(x.result.confirmed for x in t.values()) and t, 90)
    timed = [t for t in trials.values() if t.result.timing]
    assert timed and all(t.result.ratio is not None and t.result.info.get("anchor") for t in timed)
    (entrants,) = worker.worker.stages.runner.tournaments
    search = sorted((t for t in timed if t.result.info.get("role") == "search"), key=lambda t: t.result.ratio)
    assert {t.candidate.hash for t in search[:5]} <= set(entrants)
    best = store.top_k(workload_id=done["workload_id"], k=1)[0]
    assert best.result.confirmed and best.candidate.hash in entrants
    assert done["best"]["candidate_hash"] == search[0].candidate.hash  # the job's best: its search's lowest ratio


def test_submissions_together_share_one_insert(db_url: str, live_server: Callable, make_token: Callable) -> None:
    """Concurrent submissions go out as multi-row INSERTs (server/batching.py): every
    request gets its own job back, as stored, in fewer statements than requests."""
    live = live_server(db_url, auth_cache_ttl=60.0)
    token = make_token(db_url, "jobs:write")
    batches: list[int] = []
    create_jobs = live.services.new_jobs.fn
    live.services.new_jobs.fn = lambda jobs: (batches.append(len(jobs)), create_jobs(jobs))[1]

    async def submit_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"{live.url}/api/v1", headers={"Authorization": f"Bearer {token}"}) as client:
            return await asyncio.gather(*(client.post("/jobs", json={**GOOD, "seed": seed}) for seed in range(120)))

    responses = asyncio.run(submit_all())
    assert [r.status_code for r in responses] == [201] * 120
    jobs = [r.json() for r in responses]
    assert [j["seed"] for j in jobs] == list(range(120)) and len({j["id"] for j in jobs}) == 120
    for job in jobs:  # each answer is the row stored for it
        stored = live.services.queue.get_job(job["id"])
        assert stored is not None and stored.seed == job["seed"] and stored.created_by is not None
    assert sum(batches) == 120 and len(batches) < 120, batches


def test_a_failed_insert_fails_every_submission_of_its_batch() -> None:
    from ws_tuner.server.batching import Batched

    def insert(items: Any) -> list[int]:
        if 13 in items:
            raise RuntimeError("database down")
        return [item * 2 for item in items]

    batched = Batched(insert, name="test")

    async def main() -> list[Any]:
        return await asyncio.gather(*(batched(i) for i in range(40)), return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        batched.close()
    failed = [i for i, r in enumerate(results) if isinstance(r, RuntimeError)]
    assert 13 in failed and all(results[i] == 2 * i for i in range(40) if i not in failed)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(batched(1))


def test_a_job_whose_reference_fails_at_its_problem_fails_with_why(db_url: str, live_server: Callable, make_token: Callable,
                                                                   worker_thread: Callable) -> None:  # fmt: skip
    """Every check runs the kernel file's reference: where it fails (out of GPU memory), the
    job fails with that reason, once, rather than failing each candidate on it (the worker
    lives on)."""
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    with live.client(token) as client:
        job = client.post("/jobs", json={**GOOD, "params": "block_K=64,block_M=128,block_N=256,split=square,swizzle=8"}).json()
        worker = worker_thread(db_url, dict(runner="oom", builder="verify-only", space="kernel"))
        done = wait_for(lambda: (j := client.get(f"/jobs/{job['id']}").json())["state"] in ("succeeded", "failed") and j, 120, what="the job")
        assert done["state"] == "failed", done
        assert done["error"].startswith("the kernel file's reference fails at this problem, and every candidate's check runs it: "
                                        "launch_error: CUDA out of memory."), done["error"]  # fmt: skip
        assert client.get(f"/jobs/{job['id']}/trials").json()["count"] == 0
        assert worker.thread.is_alive()
