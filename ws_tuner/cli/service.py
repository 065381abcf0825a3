"""``ws-tune serve``, ``ws-tune worker`` and ``ws-tune token``: the tuning service."""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .common import (
    EXIT_NOT_FOUND,
    DbOpt,
    _fail,
    app,
    err,
    handles_errors,
    out,
    token_app,
)

# --- the service: serve, worker, token --------------------------------------------


@app.command()
@handles_errors
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default 127.0.0.1; others need a token)"),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default 8000)"),
    db: Optional[str] = DbOpt,
    workers: Optional[int] = typer.Option(None, "--workers", help="Embedded tuning workers (default: 1 on SQLite, 0 on PostgreSQL)"),
    http_workers: Optional[int] = typer.Option(None, "--http-workers", help="uvicorn worker processes"),
    kernel_dir: Optional[list[Path]] = typer.Option(None, "--kernel-dir", help="Register the kernel files of this directory (repeatable)"),
    access_log: Optional[bool] = typer.Option(None, "--access-log/--no-access-log", help="Log every request (default: off)"),
    worker_arg: Optional[list[str]] = typer.Option(None, "--worker-arg", hidden=True, help="Passed to the embedded workers (tests)"),
) -> None:
    """Run the tuning service: the REST API (/api/v1, docs at /docs) and, on SQLite, a worker."""
    from ..server.config import load_settings
    from ..server.process import serve as run_server

    settings = load_settings(host=host, port=port, db=db, workers=workers, http_workers=http_workers, access_log=access_log,
                             kernel_dirs=[p.resolve() for p in kernel_dir] if kernel_dir else None)  # fmt: skip
    check_port(settings.host, settings.port)
    run_server(settings, worker_args=list(worker_arg or []))


def check_port(host: str, port: int) -> None:
    """A port another process holds is one line and exit 2, before anything starts
    (uvicorn would log six lines and exit 3 after the workers were up)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise _fail(f"cannot listen on {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            why = "is in use by another process (choose another with --port)" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror}"
            raise _fail(f"port {port} on {host} {why}") from None


@app.command()
@handles_errors
def worker(
    gpu: Optional[int] = typer.Option(None, "--gpu", help="GPU index to time on"),
    db: Optional[str] = DbOpt,
    jobs: int = typer.Option(1, "--jobs", "-j", help="Parallel compile processes"),
    compile_timeout: float = typer.Option(300.0, "--compile-timeout", help="Seconds per compile"),
    run_timeout: float = typer.Option(60.0, "--run-timeout", help="Seconds per GPU check + timing"),
    drain_timeout: Optional[float] = typer.Option(None, "--drain-timeout", help="On SIGTERM, seconds to finish the candidates in flight"),
    heartbeat: Optional[float] = typer.Option(None, "--heartbeat", help="Seconds between heartbeats"),
    grace: Optional[float] = typer.Option(None, "--grace", help="A trial whose heartbeat is older is re-queued"),
    poll: Optional[float] = typer.Option(None, "--poll", hidden=True),
    compile_only: bool = typer.Option(False, "--compile-only", help="Verify and compile; time nothing (the default without a GPU)"),
    exit_when_idle: bool = typer.Option(False, "--exit-when-idle", help="Leave once no job this worker could run is unfinished (batch use)"),
    settings_stdin: bool = typer.Option(False, "--settings-stdin", hidden=True, help="Settings as JSON on stdin (serve's workers)"),
) -> None:
    """Run jobs from the service's queue on this machine's GPU (one worker per GPU)."""
    from ..server.config import load_settings
    from ..server.process import read_worker_settings, run_worker
    from ..server.worker import WorkerOptions

    if jobs < 1:
        raise _fail("--jobs must be >= 1")
    overrides = dict(db=db, drain_timeout=drain_timeout, heartbeat_interval=heartbeat, grace_period=grace, poll_interval=poll)
    settings = read_worker_settings(sys.stdin, **overrides) if settings_stdin else load_settings(**overrides)
    options = WorkerOptions(gpu=gpu, compile_only=compile_only, jobs=jobs, compile_timeout=compile_timeout, run_timeout=run_timeout,
                            exit_when_idle=exit_when_idle)  # fmt: skip
    run_worker(settings, options)


@token_app.command("create")
@handles_errors
def token_create(
    name: str = typer.Option("default", "--name", help="A label for listings"),
    scope: Optional[list[str]] = typer.Option(None, "--scope", help="read, jobs:write, kernels:upload, admin (repeatable; default read,jobs:write)"),
    db: Optional[str] = DbOpt,
) -> None:
    """Create an API token and print it, once: only its hash is stored."""
    from ..server.security import (
        display_prefix,
        generate_token,
        hash_token,
        parse_scopes,
    )
    from ..store import open_store
    from ..store.registry import Registry

    scopes = parse_scopes(scope)
    token = generate_token()
    with open_store(db) as store:
        record = Registry(store).add_token(name=name, token_hash=hash_token(token), prefix=display_prefix(token), scopes=scopes)
    err.print(f"token {record.id} ({record.name}; scopes {' '.join(record.scopes)}): shown once, store it now")
    out.print(token)


@token_app.command("list")
@handles_errors
def token_list(db: Optional[str] = DbOpt, all_: bool = typer.Option(False, "--all", help="Include revoked tokens")) -> None:
    """List tokens (their prefixes and scopes; tokens themselves are not stored)."""
    from ..store import open_store
    from ..store.registry import Registry

    with open_store(db) as store:
        records = Registry(store).list_tokens(include_revoked=all_)
    table = Table(title="API tokens")
    for col in ("id", "name", "prefix", "scopes", "created", "revoked"):
        table.add_column(col)
    for r in records:
        table.add_row(str(r.id), r.name, r.prefix + "...", " ".join(r.scopes), f"{r.created_at:%Y-%m-%d %H:%M}",
                      f"{r.revoked_at:%Y-%m-%d %H:%M}" if r.revoked_at else "")  # fmt: skip
    out.print(table)


@token_app.command("revoke")
@handles_errors
def token_revoke(ident: str = typer.Argument(..., help="Token id or prefix"), db: Optional[str] = DbOpt) -> None:
    """Revoke a token (servers notice within a few seconds)."""
    from ..store import open_store
    from ..store.registry import Registry

    with open_store(db) as store:
        n = Registry(store).revoke_token(ident)
    if not n:
        raise _fail(f"no active token {ident!r}", EXIT_NOT_FOUND)
    out.print(f"revoked {n} token(s)")
