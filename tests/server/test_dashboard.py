"""The dashboard on a real uvicorn server and a real SQLite database seeded through
the real store (a tuning by the real Tuner: real space and verifier, the runner
double): its JSON (/api/v1/workloads) and, in Debian's chromium driven by
Playwright, the page: it loads with nothing from outside this server, the plot
has a point per timed trial, the leaderboard names the winner, the schedules sit
side by side, and a job's progress moves as a worker process runs it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import httpx
import pytest
from svc_helpers import FAKE_ARGS, ROOT, wait_for

from ws_tuner import search
from ws_tuner.candidate import Lowering
from ws_tuner.store import Store
from ws_tuner.testing import DummyRunner, VerifyOnlyBuilder
from ws_tuner.tune import SEARCH, TuneOptions, Tuner

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (.ci/run installs it); never a downloaded browser
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
AXES = {"block_K": (64,), "block_M": (128,), "block_N": (128, 256), "epilogue": ("direct",), "persistent": (False,), "swizzle": (0, 8)}


@pytest.fixture
def tuned(gemm_spec, tmp_path: Path, open_db: Callable[[str], Store]) -> tuple[str, Any]:
    """A SQLite database holding one finished tuning (baselines, search, tournament)."""
    from ws_tuner.task import Task

    url = f"sqlite:///{tmp_path / 'ws-tune.db'}"
    task = Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), AXES)
    tuner = Tuner(task, store=open_db(url), builder=VerifyOnlyBuilder(), runner=DummyRunner(), strategy=search.create("tpe", seed=2),
                  options=TuneOptions(budget=12))  # fmt: skip
    return url, tuner.run()


def test_workload_json_has_the_leaderboard_the_trials_and_the_schedules(tuned, live_server) -> None:
    url, report = tuned
    server = live_server(url)
    with server.client() as client:
        listed = client.get("/workloads").json()
        assert listed["count"] == 1
        summary = listed["data"][0]
        assert summary["id"] == report.workload_id and summary["kernel"] == "gemm" and summary["problem"]["M"] == 4096
        assert summary["trials"] == len(report.records)
        assert summary["best_candidate_hash"] == report.best.candidate.hash and summary["best_tflops"] == report.best.result.tflops
        assert summary["best_gbps"] is None  # gemm.py does not say what a call moves

        w = client.get(f"/workloads/{report.workload_id}").json()
        rows = {r["name"]: r for r in w["leaderboard"]}
        assert list(rows) == ["ws-tune best", "seed", "default", "no_ws", "role_based", "reference"]
        assert rows["ws-tune best"]["candidate_hash"] == report.best.candidate.hash and rows["ws-tune best"]["confirmed"]
        for kind in ("seed", "default", "no_ws", "role_based", "reference"):
            assert rows[kind]["candidate_hash"] == report.baseline(kind).candidate.hash
            assert rows[kind]["tflops"] == pytest.approx(report.baseline(kind).result.tflops)

        found = report.found()
        assert [p["candidate_hash"] for p in w["trials"]] == [r.candidate.hash for r in found]
        assert sum(p["role"] == SEARCH for p in w["trials"]) == 12
        assert w["trials"][-1]["best_tflops"] == pytest.approx(report.best.result.tflops)  # the curve ends at the winner

        seed = report.baseline("seed").candidate
        assert "T.annotate_ws_schedule(" in w["seed_source"] and "T.annotate_ws_schedule(" in w["best_source"]
        assert [d["seed"] for d in w["diff"] if d["seed"] is not None] == w["seed_source"].splitlines()
        assert [d["best"] for d in w["diff"] if d["best"] is not None] == w["best_source"].splitlines()
        if report.best.candidate != seed:
            assert any(d["op"] != "same" for d in w["diff"])
        assert report.best.candidate.lowering is Lowering.WS

        missing = client.get("/workloads/999999")
        assert missing.status_code == 404 and missing.json() == {"detail": "workload 999999 not found"}
        assert client.get("/workloads", params={"kernal": "gemm"}).status_code == 422  # a misspelt filter is refused


def test_a_kernel_that_says_what_it_moves_shows_gbps(data_dir: Path, tmp_path: Path, open_db: Callable[[str], Store], live_server) -> None:
    """rmsnorm's ``bytes_moved``: GB/s stored by the tuning, served beside TFLOP/s for the
    workload's best, its leaderboard and its trials."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    url = f"sqlite:///{tmp_path / 'ws-tune.db'}"
    spec = load_kernel(data_dir / "rmsnorm.py")
    task = Task.make(spec, spec.parse_problem("M=1024,N=1024"), spec.parse_params("blk_m=1,blk_k=512,num_stages=1,threads=128"))
    report = Tuner(task, store=open_db(url), builder=VerifyOnlyBuilder(), runner=DummyRunner(), strategy=search.create("random", seed=1),
                   options=TuneOptions(budget=2)).run()  # fmt: skip
    moved = spec.bytes_moved(task.problem)
    assert report.best.result.gbps == pytest.approx(moved / (report.best.result.timing.median_ms * 1e-3) / 1e9)
    with live_server(url).client() as client:
        assert client.get("/workloads").json()["data"][0]["best_gbps"] == pytest.approx(report.best.result.gbps)
        w = client.get(f"/workloads/{report.workload_id}").json()
    timed = [r for r in w["leaderboard"] + w["trials"] if r["median_ms"] is not None]
    assert timed and all(r["gbps"] == pytest.approx(moved / (r["median_ms"] * 1e-3) / 1e9) for r in timed), timed


def test_workloads_need_a_token_when_reads_do(tuned, live_server, make_token) -> None:
    url, report = tuned
    server = live_server(url, public_reads=False)
    with server.client() as client:
        assert client.get(f"/workloads/{report.workload_id}").status_code == 401
    with server.client(make_token(url, "read")) as client:
        assert client.get(f"/workloads/{report.workload_id}").status_code == 200


def test_the_dashboard_command_serves_a_local_database(tuned, tmp_path: Path) -> None:
    """`ws-tune dashboard --db URL`: the page and its data, from a database no service runs on."""
    url, report = tuned
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WS_TUNE_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    log = tmp_path / "dashboard.log"
    proc = subprocess.Popen([sys.executable, "-m", "ws_tuner", "dashboard", "--db", url, "--port", str(port)], env=env, cwd=ROOT,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(base + "/dashboard") == 200, 30, 0.1, "the dashboard")
        assert 'src="/dashboard/static/dashboard.js"' in httpx.get(base + "/dashboard").text
        assert httpx.get(base + "/dashboard/static/dashboard.js").status_code == 200
        workloads = httpx.get(base + "/api/v1/workloads").json()
        assert [w["id"] for w in workloads["data"]] == [report.workload_id]
        assert httpx.get(base + "/api/v1/ready").json()["workers_alive"] == 0  # it runs nothing
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()[-2000:]
    assert f"dashboard at http://127.0.0.1:{port}/dashboard" in log.read_text()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


# --- in a real browser ---------------------------------------------------------------------------


@pytest.fixture
def browser_page() -> Any:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _offline(page: Any, origin: str) -> list[str]:
    """Refuse every request to another host, as an air-gapped cluster would; returns their list."""
    outside: list[str] = []

    def route(r: Any) -> None:
        if urlparse(r.request.url).netloc == urlparse(origin).netloc or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return outside


def test_the_dashboard_in_a_browser(tuned, live_server, browser_page, make_job, spawn_worker) -> None:
    url, report = tuned
    server = live_server(url)
    page = browser_page
    outside = _offline(page, server.url)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    job = make_job(url, budget=16)

    page.goto(server.url + "/dashboard")
    # The newest workload is shown: the leaderboard names the winner, the plot has a point per timed trial.
    page.wait_for_selector('#leaderboard tr[data-row="ws-tune best"]')
    assert report.best.candidate.hash in page.inner_text('#leaderboard tr[data-row="ws-tune best"]')
    timed = [r for r in report.found() if r.result.tflops is not None]
    page.wait_for_function("n => document.querySelectorAll('#plot circle.trial').length === n", arg=len(timed))
    assert page.locator("#plot path.best").get_attribute("d").count("L") == len(report.found()) - 1
    assert page.locator("#diff tbody tr").count() >= len(report.best.candidate.schedule.to_source().splitlines())
    assert page.locator("#diff tr.changed, #diff tr.added, #diff tr.removed").count() > 0

    # A job's progress moves while a worker process runs it.
    cell = f'tr[data-job-id="{job.id}"] .done'
    page.wait_for_selector(cell)
    assert page.inner_text(cell) == "0" and "queued" in page.inner_text(f'tr[data-job-id="{job.id}"]')
    spawn_worker(url, *FAKE_ARGS, "--runner-delay", "0.25")
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while (not seen or seen[-1] < 16) and time.monotonic() < deadline:
        value = int(page.inner_text(cell))
        if not seen or value != seen[-1]:
            seen.append(value)
        page.wait_for_timeout(100)
    assert seen[0] == 0 and seen[-1] == 16, seen
    assert any(0 < v < 16 for v in seen), seen  # shown moving, not only before and after
    assert seen == sorted(seen)
    page.wait_for_function(f"""() => document.querySelector('tr[data-job-id="{job.id}"] .state').textContent === 'succeeded'""")
    # The job's workload joins the list.
    page.wait_for_function("() => document.querySelectorAll('#workloads-table tr[data-workload-id]').length === 2", timeout=15000)
    assert not errors, errors
    assert not outside, outside


@pytest.mark.parametrize("path, rendered", [("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")])
def test_api_docs_render_offline_in_a_browser(tmp_path: Path, live_server, browser_page, path: str, rendered: str) -> None:
    server = live_server(f"sqlite:///{tmp_path / 'ws-tune.db'}")
    page = browser_page
    outside = _offline(page, server.url)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + path)
    page.wait_for_selector(rendered, timeout=20000)
    assert re.search(r"ws-tune", page.inner_text(rendered))
    # ReDoc's bundle tries to show Redocly's logo (its <img> removes itself when that fails):
    # a decoration, the one request the page makes elsewhere, refused here as offline.
    assert not errors and not [u for u in outside if u != REDOCLY_LOGO], (errors, outside)
    assert httpx.get(server.url + "/openapi.json").status_code == 200
