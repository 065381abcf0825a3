"""``ws-tune serve`` and ``ws-tune worker``: process-level plumbing.

``serve`` checks the database (one-line errors), refuses to expose an
unauthenticated server, starts the embedded workers as *subprocesses* (so
uploaded kernel code never runs in the server's process), runs uvicorn, and
drains the workers when it stops. ``worker`` runs one worker with signal
handling: the first SIGTERM/SIGINT drains, the second hands back at once.

Both seal themselves (sandbox.py) once their settings are read: no secret is
left in their environment, and their memory and initial environment cannot be
read by the kernel code that runs, as the same user, in a worker's children.
An embedded worker gets its settings over a pipe (its stdin), never in its
environment or command line, and never the bootstrap token.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .. import sandbox
from ..store import open_store
from ..store.registry import Registry
from ..store import mask_url
from .config import Settings, load_settings
from .security import is_loopback

_log = logging.getLogger("ws_tuner.serve")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("sqlalchemy").setLevel(logging.WARNING)
    logging.getLogger("tilelang").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def check_bind(settings: Settings, registry: Registry) -> None:
    """A server reachable from other hosts must have a token to check (it runs their code)."""
    if is_loopback(settings.host) or settings.bootstrap_token is not None or registry.active_token_count() > 0:
        return
    raise ValueError(
        f"refusing to listen on {settings.host}: it is not a loopback address and no API token is configured; "
        "create one with `ws-tune token create` (same --db) or set WS_TUNE_BOOTSTRAP_TOKEN"
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as WS_TUNE_* variables, for processes started from this one."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if name == "bootstrap_token":
            value = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
        elif name == "kernel_dirs":
            value = ",".join(str(p) for p in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        if value is not None:
            env[f"WS_TUNE_{name.upper()}"] = str(value)
    return env


# libpq reads these from the environment; a process that connects keeps them (PGPASSWORD aside, see below).
LIBPQ_PREFIX = "PG"


def seal(settings: Settings) -> Settings:
    """Seal this process (sandbox.py), keeping what libpq reads besides the
    password, which moves from PGPASSWORD into the settings' database URL."""
    password = os.environ.pop("PGPASSWORD", None)
    if password and settings.db and settings.db.startswith("postgresql"):
        from sqlalchemy import make_url

        url = make_url(settings.db)
        if url.password is None:
            settings = settings.model_copy(update={"db": url.set(password=password).render_as_string(hide_password=False)})
    sandbox.seal_process(keep=[n for n in os.environ if n.startswith(LIBPQ_PREFIX)])
    return settings


def worker_settings_json(settings: Settings) -> str:
    """What an embedded worker needs of the settings, as JSON for its stdin: no bootstrap token."""
    return settings.model_dump_json(exclude={"bootstrap_token"})


def read_worker_settings(stream: Any, **overrides: Any) -> Settings:
    """The settings an embedded worker was given on ``stream`` (its stdin), with ``overrides`` on top."""
    given = json.loads(stream.read() or "{}")
    given.pop("bootstrap_token", None)
    return load_settings(**{**given, **{k: v for k, v in overrides.items() if v is not None}})


class EmbeddedWorkers:
    """Worker subprocesses of ``serve``, restarted if they die, drained at the end."""

    def __init__(self, count: int, settings_json: str, args: list[str]) -> None:
        self.count, self.settings_json, self.args = count, settings_json, args
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="ws-tune-workers", daemon=True)

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "ws_tuner", "worker", "--settings-stdin", *self.args]
        env = sandbox.clean_environment(keep=[n for n in os.environ if n.startswith(LIBPQ_PREFIX)])
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE)
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(self.settings_json.encode())
        return proc

    def start(self) -> None:
        for i in range(self.count):
            self.procs[i] = self._spawn()
        self._thread.start()

    def _supervise(self) -> None:
        backoff = [1.0] * self.count
        while not self._stopping.wait(1.0):
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    _log.warning("embedded worker %d exited with %s; restarting in %.0f s", i, proc.returncode, backoff[i])
                    if self._stopping.wait(backoff[i]):
                        return
                    backoff[i] = min(backoff[i] * 2, 60.0)
                    self.procs[i] = self._spawn()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in live:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for the API (benchmarks/service_bench.py runs its ceiling under the same)."""
    return dict(
        host=settings.host, port=settings.port, log_level=settings.log_level.lower(), access_log=settings.access_log,
        server_header=False, proxy_headers=False, timeout_graceful_shutdown=10,
        http="httptools" if importlib.util.find_spec("httptools") else "auto",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "auto",
    )  # fmt: skip


def freeze_startup_objects() -> None:
    """Move what exists once the app is built (modules, routes, schemas, the store)
    out of the collector's sight: it lives as long as the process, and a full
    collection walking it paused the event loop for 30 to 100 ms under load, the p99
    of uncached lookups. A serving process only (a test that builds apps would
    keep their garbage for ever)."""
    gc.collect()
    gc.freeze()


def serve(settings: Settings, *, worker_args: list[str] | None = None) -> None:
    import uvicorn

    from .main import create_app
    from .state import Services

    configure_logging(settings.log_level)
    settings = seal(settings)
    store = open_store(settings.db, timeouts=settings.db_timeouts)  # bad URL, unreachable server, outdated schema: one line, exit 2
    url = store.url
    settings = settings.model_copy(update={"db": url})
    try:
        check_bind(settings, Registry(store))
    finally:
        store.close()
    workers = settings.workers if settings.workers is not None else (1 if url.startswith("sqlite") else 0)
    embedded = EmbeddedWorkers(workers, worker_settings_json(settings), worker_args or []) if workers else None
    _log.info("ws-tune serving %s on http://%s:%d/api/v1 (docs at /docs), %d embedded worker(s)",
              mask_url(url), settings.host, settings.port, workers)  # fmt: skip
    if embedded:
        embedded.start()
    # uvicorn restores the previous handlers after its graceful shutdown and
    # re-raises the signal it caught; with Python's defaults that kills this
    # process before the embedded workers are drained. A no-op handler instead
    # lets the shutdown below run, and the process exits normally.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    try:
        common = uvicorn_options(settings)
        if settings.http_workers > 1:
            # uvicorn's processes build the app from the environment (and seal themselves, app_from_env).
            os.environ.update(settings_env(settings))
            uvicorn.run("ws_tuner.server.main:app_from_env", factory=True, workers=settings.http_workers, **common)
        else:
            app = create_app(settings, services=Services.open(settings))
            freeze_startup_objects()
            uvicorn.Server(uvicorn.Config(app, **common)).run()
    finally:
        if embedded:
            embedded.stop(settings.drain_timeout + 5)


# A worker still alive this long past its drain time waits on something without a bound
# (it should be gone GOODBYE_S + a second or two after it): every thread's stack goes to
# the log, again at this interval, to name the wait. faulthandler's own thread does it,
# so it works whatever the worker's threads are stuck on, and costs nothing until then.
STACKS_AFTER_S = 10.0


def run_worker(settings: Settings, options: Any, *, stages: Any = None) -> int:
    import faulthandler

    from .worker import Worker

    configure_logging(settings.log_level)
    settings = seal(settings).model_copy(update={"bootstrap_token": None})  # a worker has no use for it
    store = open_store(settings.db, timeouts=settings.db_timeouts)
    try:
        worker = Worker(store, settings, options, stages=stages)

        def on_signal(signum: int, frame: Any) -> None:
            if worker.draining:
                worker.abort()
            else:
                faulthandler.dump_traceback_later(settings.drain_timeout + STACKS_AFTER_S, repeat=True, file=sys.stderr)
                worker.drain()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        return worker.run()
    finally:
        store.close()
        # Leaving: the interpreter's finalization would run its collector over every object
        # left (100k and more: SQLAlchemy, Optuna, pydantic), several times as modules are
        # torn down: 0.5 s of CPU, and seconds of a stopping worker's time on a loaded host
        # (the one part of leaving that grew with load). What is left needs no collector:
        # the engines are disposed, the stages closed; plain reference counting frees the rest.
        gc.freeze()
