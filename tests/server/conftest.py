"""Fixtures of the service tests: a real uvicorn server on loopback (in a thread,
on a socket bound to a free port), tokens, jobs, and workers as threads or as
real ``ws-tune worker`` processes, on SQLite and PostgreSQL (the root
conftest's ``db_url``, ``pg_url`` and ``open_db``).

Workers use the package's test doubles (``--space fake --builder fake
--runner dummy``) unless a test is about the real kernel; leases are short
(heartbeat 0.3 s, grace 1.5 s) so that failure scenarios play out in seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from ws_tuner.server.config import Settings
from ws_tuner.server.main import create_app
from ws_tuner.server.security import display_prefix, generate_token, hash_token
from ws_tuner.server.state import Services
from ws_tuner.server.worker import Worker, WorkerOptions
from ws_tuner.testing.service import test_stages
from ws_tuner.store import Store
from ws_tuner.store.queue import JobQueue, JobRecord
from ws_tuner.store.registry import Registry

from svc_helpers import EXAMPLES, FAKE, FAKE_ARGS, GRACE, HEARTBEAT, ROOT, fast_settings, wait_for  # noqa: E402

@dataclass
class LiveServer:
    url: str
    settings: Settings
    services: Services
    server: uvicorn.Server
    thread: threading.Thread
    log: list[str]

    @property
    def api(self) -> str:
        return self.url + "/api/v1"

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api, headers=headers, timeout=30, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class _ListHandler:
    """Collects every log line the server process writes while it runs (to check no token leaks)."""

    def __init__(self, sink: list[str]) -> None:
        import logging

        self.sink = sink
        self.handler = logging.Handler()
        self.handler.emit = lambda record: sink.append(self.handler.format(record))  # type: ignore[method-assign]
        self.handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.handler.setLevel(logging.DEBUG)
        self.loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.access", "uvicorn.error", "ws_tuner")]

    def __enter__(self) -> "_ListHandler":
        for logger in self.loggers:
            logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger in self.loggers:
            logger.removeHandler(self.handler)


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start ``create_app`` under uvicorn on 127.0.0.1 and a free port; stopped after the test."""
    started: list[LiveServer] = []
    handlers: list[_ListHandler] = []

    def start(db_url: str, **overrides: Any) -> LiveServer:
        settings = fast_settings(db_url, tmp_path, **overrides)
        app = create_app(settings)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="info", access_log=True, lifespan="on", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        log: list[str] = []
        handler = _ListHandler(log).__enter__()
        handlers.append(handler)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        wait_for(lambda: server.started, 15, what="uvicorn to start")
        live = LiveServer(f"http://127.0.0.1:{port}", settings, app.state.services, server, thread, log)
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()
    for handler in handlers:
        handler.__exit__()


@pytest.fixture
def make_token(open_db: Callable[[str], Store]) -> Callable[..., str]:
    """A stored token with the given scopes (as `ws-tune token create` makes them)."""

    def make(db_url: str, *scopes: str, name: str = "test") -> str:
        token = generate_token()
        Registry(open_db(db_url)).add_token(name=name, token_hash=hash_token(token), prefix=display_prefix(token),
                                            scopes=tuple(scopes) or ("jobs:write",))  # fmt: skip
        return token

    return make


@pytest.fixture
def make_job(open_db: Callable[[str], Store]) -> Callable[..., JobRecord]:
    """A job straight into the queue (the API's own checks are tested through the API)."""

    def make(db_url: str, budget: int = 10, strategy: str = "random", **kw: Any) -> JobRecord:
        store = open_db(db_url)
        registry = Registry(store)
        source = (EXAMPLES / "gemm.py").read_text()
        from ws_tuner.server.kernels import problem_signature

        kernel = registry.put_kernel("gemm", source, registered=True, problem=problem_signature(source))
        problem = {"K": 4096, "M": 4096, "N": 4096, "b_layout": "row", "dtype": "float16"}
        args: dict[str, Any] = dict(kernel_id=kernel.id, kernel="gemm", problem=problem, problem_checked=True, params=None,
                                    strategy=strategy, seed=0, budget=budget)  # fmt: skip
        return JobQueue(store).create_job(**{**args, **kw})

    return make


@dataclass
class WorkerThread:
    worker: Worker
    thread: threading.Thread
    jobs: list[int]

    def stop(self, abort: bool = False, timeout: float = 30) -> None:
        (self.worker.abort if abort else self.worker.drain)()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker thread did not stop"


@pytest.fixture
def worker_thread(tmp_path: Path, open_db: Callable[[str], Store]) -> Iterator[Callable[..., WorkerThread]]:
    """A worker running in a thread of the test process (fast; for API-level tests)."""
    running: list[WorkerThread] = []

    def start(db_url: str, stages: dict[str, str] = FAKE, options: WorkerOptions = WorkerOptions(), **overrides: Any) -> WorkerThread:
        worker = Worker(open_db(db_url), fast_settings(db_url, tmp_path, **overrides), options, stages=test_stages(**stages, options=options))
        jobs: list[int] = []
        thread = threading.Thread(target=lambda: jobs.append(worker.run()), daemon=True)
        thread.start()
        wt = WorkerThread(worker, thread, jobs)
        running.append(wt)
        return wt

    yield start
    for wt in running:
        if wt.thread.is_alive():
            wt.stop(abort=True)


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """A worker process, killed after the test: `python -m ws_tuner worker ...`, or with
    FAKE_ARGS the test-only `python -m ws_tuner.testing.worker ...` (test doubles)."""
    procs: list[subprocess.Popen] = []

    def spawn(db_url: str, *args: str, log_name: str | None = None, heartbeat: float = HEARTBEAT, grace: float = GRACE,
              env: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_DB": db_url,
            "WS_TUNE_KERNEL_CACHE_DIR": str(tmp_path / "kernel-cache"), "WS_TUNE_LOG_LEVEL": "info", **(env or {}),
        }  # fmt: skip
        log = open(tmp_path / (log_name or f"worker-{len(procs)}.log"), "wb")
        entry = ["ws_tuner.testing.worker"] if set(args) & set(FAKE_ARGS) else ["ws_tuner", "worker"]
        cmd = [sys.executable, "-m", *entry, "--heartbeat", str(heartbeat), "--grace", str(grace), "--poll", "0.1", *args]
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc.log_path = tmp_path / (log_name or f"worker-{len(procs)}.log")  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            with _suppress():
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


@pytest.fixture
def queue_of(open_db: Callable[[str], Store]) -> Callable[[str], JobQueue]:
    return lambda db_url: JobQueue(open_db(db_url))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow` service tests (a 30 s outage, Optuna-shared 8 x 500) run only when asked
    for (`-m slow`, or WS_TUNE_SLOW=1): the default suite stays within minutes."""
    if os.environ.get("WS_TUNE_SLOW") or "slow" in (config.getoption("-m") or ""):
        return
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="slow: run with -m slow or WS_TUNE_SLOW=1")
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
