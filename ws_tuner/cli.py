"""The ``ws-tune`` command line (typer + rich).

    ws-tune FILE --shape M=4096,N=4096,K=4096 [--budget N] [--compile-only] [--db URL] [--jobs N]
    ws-tune space FILE --shape ...      the axes, and the counts before and after pruning
    ws-tune best FILE --shape ...       the best stored schedule, as TileLang code and JSON
    ws-tune export FILE --shape ...     the JSON artifact of a tuning
    ws-tune db upgrade|current          the database schema
    ws-tune serve [--host H --port P]   the tuning service (REST API; an embedded worker on SQLite)
    ws-tune worker [--gpu N]            a worker running the service's jobs on one GPU
    ws-tune token create|list|revoke    API tokens of the service

Bad input is one line on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=__doc__)
db_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Database schema commands.")
app.add_typer(db_app, name="db")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 1

ShapeOpt = typer.Option(..., "--shape", "-s", help="Problem arguments, e.g. M=4096,N=4096,K=4096[,dtype=bfloat16]")
ParamOpt = typer.Option(None, "--param", "-p", help="Pin kernel parameters, e.g. block_M=128,swizzle=8")
SpaceOpt = typer.Option(None, "--space", help="Axis values of the schedule space, as TOML (see configs/space-focused.toml)")
DbOpt = typer.Option(None, "--db", help="Database URL or SQLite path (default: $WS_TUNE_DB, else ~/.cache/ws-tune/ws-tune.db)")


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", markup=True)
    return typer.Exit(code)


def _compiler_errors() -> tuple[type[Exception], ...]:
    # Only a loaded compiler can have raised: commands that never touch tilelang
    # (serve, worker, token) then start without importing it (seconds, and torch).
    compiler = sys.modules.get(f"{__package__}.compiler")
    return (compiler.CompilerError,) if compiler is not None else ()


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures become one line and exit code 2; anything else one line and 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .kernel import KernelFileError
        from .store import StoreError

        try:
            return fn(*args, **kwargs)
        except (KernelFileError, StoreError, ValueError, *_compiler_errors()) as exc:
            raise _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            raise _fail("interrupted", 130) from None
        except Exception as exc:  # noqa: BLE001 - the promise is: no traceback
            if os.environ.get("WS_TUNE_DEBUG"):
                raise
            raise _fail(f"internal error: {type(exc).__name__}: {exc}".splitlines()[0] + " (WS_TUNE_DEBUG=1 shows the traceback)", 1) from None

    return wrapper


def _task(file: Path, shape: str, param: Optional[str], space: Optional[Path] = None) -> Any:
    from .kernel import load_kernel
    from .space import SpaceConfig
    from .task import Task

    spec = load_kernel(file)
    config = SpaceConfig.from_toml(space) if space else None
    return Task.make(spec, spec.parse_problem(shape), spec.parse_params(param), config)


# --- tune -------------------------------------------------------------------


@app.command()
@handles_errors
def tune(
    file: Path = typer.Argument(..., help="Kernel file (see examples/gemm.py and ws_tuner/kernel.py)"),
    shape: str = ShapeOpt,
    param: Optional[str] = ParamOpt,
    space_config: Optional[Path] = SpaceOpt,
    budget: int = typer.Option(64, "--budget", "-n", help="Search candidates to measure (baselines come on top)"),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="Stop searching after this many seconds"),
    strategy: str = typer.Option("tpe", "--strategy", help="grid, random or tpe"),
    compile_only: bool = typer.Option(False, "--compile-only", help="Verify and compile; time nothing"),
    db: Optional[str] = DbOpt,
    jobs: int = typer.Option(max((os.cpu_count() or 2) - 1, 1), "--jobs", "-j", help="Parallel compile workers"),
    gpu: int = typer.Option(0, "--gpu", help="GPU index to time on"),
    seed: int = typer.Option(0, "--seed", help="Sampler seed"),
    compile_timeout: float = typer.Option(300.0, "--compile-timeout", help="Seconds per compile"),
    run_timeout: float = typer.Option(60.0, "--run-timeout", help="Seconds per GPU check + timing"),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="Measure tilelang's own lowerings too"),
) -> None:
    """Tune FILE at one problem: search schedules, build, time, store."""
    from . import search
    from .builder import LocalBuilder
    from .runner import EvaluatorConfig, LocalRunner, gpu_available
    from .space import SpaceCount
    from .store import open_store
    from .tune import TuneOptions, Tuner

    if budget < 0 or jobs < 1:
        raise _fail("--budget must be >= 0 and --jobs >= 1")
    if strategy not in search.KINDS:
        raise _fail(f"unknown strategy {strategy!r}; choose one of {', '.join(search.KINDS)}")
    task = _task(file, shape, param, space_config)
    # Kernel or shape errors surface here, before the database is touched. One
    # survivor is enough: counting the whole space takes seconds.
    count = SpaceCount()
    if next(task.space().walk(count), None) is None:
        reason = count.examples[count.pruned.most_common(1)[0][0]] if count.pruned else "the space is empty"
        raise _fail(f"no candidate survives static pruning at this problem (e.g. {reason})")
    store = open_store(db)
    if not compile_only and not gpu_available():
        err.print("no NVIDIA GPU found: compile-only (schedules are verified and compiled, not timed)")
        compile_only = True
    options = TuneOptions(budget=budget, time_budget=time_budget, jobs=jobs, baselines=baselines,
                          evaluator=EvaluatorConfig(timeout=run_timeout))  # fmt: skip
    runner = None if compile_only else LocalRunner(gpu)
    with LocalBuilder(jobs=jobs, timeout=compile_timeout) as builder, _progress() as progress:
        bar = progress.add_task("tuning", total=None)
        done = [0]

        def listener(event: str, record: Any) -> None:
            if event == "confirm":
                progress.update(bar, description="confirming the leaders")
                return
            done[0] += 1
            progress.update(bar, completed=done[0], description=f"{record.result.status.value:>13} {record.candidate.describe()[:70]}")

        tuner = Tuner(task, store=store, builder=builder, runner=runner, strategy=search.create(strategy, seed=seed),
                      options=options, listener=listener)  # fmt: skip
        try:
            report = tuner.run()
        finally:
            if runner:
                runner.close()
    _print_report(report, task)
    if report.interrupted:
        raise typer.Exit(130)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True)


def _print_report(report: Any, task: Any) -> None:
    from .candidate import Lowering

    counts = report.counts()
    table = Table(title=f"{task.spec.name} {report.key.problem} on {report.key.device}")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for status, n in sorted(counts.items()):
        table.add_row(status, str(n))
    if report.pruned:
        table.add_row("pruned (static rules)", str(report.pruned))
    cached = sum(r.cached for r in report.records)
    table.caption = f"{len(report.records)} candidates in {report.wall_seconds:.1f} s ({cached} reused from the store)"
    out.print(table)
    if report.compile_only:
        out.print("compile-only: nothing was timed; run on a Hopper GPU to rank the built candidates.")
        return
    best = report.best
    rows = [("ws-tune best", best)] + [(k, report.baseline(k)) for k in ("seed", "default", "role_based", "reference")]
    speed = Table(title="speed")
    for col in ("schedule", "TFLOP/s", "median ms", "spread", "best / this"):
        speed.add_column(col, justify="right" if col != "schedule" else "left")
    for name, rec in rows:
        if rec is None:
            speed.add_row(name, "-", "-", "-", "-")
            continue
        t = rec.result.timing
        ratio = best.result.timing.median_ms and t.median_ms / best.result.timing.median_ms if best else None
        speed.add_row(name, f"{rec.result.tflops:.0f}", f"{t.median_ms:.4f}", f"{t.spread:.1%}", f"{ratio:.3f}x" if ratio else "-")
    out.print(speed)
    if best is not None and best.candidate.lowering is Lowering.WS:
        out.print(f"best: {best.candidate.describe()}  (candidate {best.candidate.hash})")
        out.print(best.candidate.schedule.to_source())


# --- space ------------------------------------------------------------------


@app.command()
@handles_errors
def space(
    file: Path = typer.Argument(...), shape: str = ShapeOpt, param: Optional[str] = ParamOpt, space_config: Optional[Path] = SpaceOpt
) -> None:
    """Print the axes of FILE's schedule space and its size before and after pruning."""
    import time

    task = _task(file, shape, param, space_config)
    sp = task.space()
    start = time.perf_counter()
    count = sp.count()
    elapsed = time.perf_counter() - start
    axes = Table(title=f"schedule space of {task.spec.name} at {json.dumps(task.problem)}")
    axes.add_column("axis")
    axes.add_column("values")
    for name, values in sp.axes().items():
        axes.add_row(name, ", ".join(map(str, values)))
    out.print(axes)
    pruned = Table(title="static pruning")
    pruned.add_column("rule")
    pruned.add_column("pruned", justify="right")
    pruned.add_column("example")
    for kind, n in count.pruned.most_common():
        pruned.add_row(kind, str(n), count.examples[kind])
    out.print(pruned)
    out.print(f"candidates: {count.total} before pruning, {count.kept} after ({elapsed:.2f} s)")


# --- best / export -------------------------------------------------------------


def _stored(file: Path, shape: str, db: Optional[str], device: Optional[str], k: int) -> tuple[Any, Any, list[Any]]:
    from . import lookup
    from .store import open_store

    task = _task(file, shape, None)
    store = open_store(db)
    key = lookup.workload_key(task, device=device)
    return task, key, lookup.fastest_compilable(store, key, k=k)


@app.command()
@handles_errors
def best(
    file: Path = typer.Argument(...),
    shape: str = ShapeOpt,
    db: Optional[str] = DbOpt,
    device: Optional[str] = typer.Option(None, "--device", help="Device name (default: this machine's GPU, else compile-only)"),
) -> None:
    """Print the best stored schedule of FILE at a problem, as TileLang code and JSON."""
    task, key, top = _stored(file, shape, db, device, k=1)
    if not top:
        raise _fail(f"no timed result stored for {task.spec.name} at {key.problem} on {key.device}; run `ws-tune {file} --shape {shape}` first", EXIT_NOT_FOUND)
    trial = top[0]
    out.print(f"# {trial.candidate.describe()}  {trial.result.tflops:.0f} TFLOP/s, {trial.result.timing.median_ms:.4f} ms")
    if trial.candidate.schedule is not None:
        out.print(trial.candidate.schedule.to_source())
    out.print(json.dumps(trial.candidate.to_json(), indent=2))


@app.command()
@handles_errors
def export(
    file: Path = typer.Argument(...),
    shape: str = ShapeOpt,
    db: Optional[str] = DbOpt,
    device: Optional[str] = typer.Option(None, "--device"),
    output: Path = typer.Option(Path("ws-tune-export.json"), "--output", "-o"),
    top: int = typer.Option(10, "--top", help="How many of the fastest to include"),
) -> None:
    """Write the JSON artifact of FILE's tuning at a problem: the key and the fastest schedules."""
    task, key, trials = _stored(file, shape, db, device, k=top)
    artifact = {
        "workload": key.to_json(),
        "results": [
            {
                "candidate": t.candidate.to_json(),
                "hash": t.candidate.hash,
                "median_ms": t.result.timing.median_ms if t.result.timing else None,
                "spread": t.result.timing.spread if t.result.timing else None,
                "tflops": t.result.tflops,
                "source": t.candidate.schedule.to_source() if t.candidate.schedule else None,
            }
            for t in trials
        ],
    }
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(json.dumps(artifact, indent=2))
    tmp.replace(output)  # atomic: a reader never sees half a file
    out.print(f"wrote {len(trials)} results to {output}")


# --- db ---------------------------------------------------------------------


@db_app.command("upgrade")
@handles_errors
def db_upgrade(db: Optional[str] = DbOpt) -> None:
    """Apply the migrations up to this ws-tune's schema."""
    from .store import resolve_db_url, upgrade
    from .store.repository import mask_url

    url = resolve_db_url(db)
    revision = upgrade(url)
    out.print(f"{mask_url(url)} is at schema revision {revision}")


@db_app.command("current")
@handles_errors
def db_current(db: Optional[str] = DbOpt) -> None:
    """Print the database's schema revision and this ws-tune's."""
    from .store import current_revision, head_revision, resolve_db_url

    out.print(f"database: {current_revision(resolve_db_url(db)) or 'empty'}; this ws-tune: {head_revision()}")


# --- the service: serve, worker, token --------------------------------------------

token_app = typer.Typer(add_completion=False, no_args_is_help=True, help="API tokens of the service.")
app.add_typer(token_app, name="token")


@app.command()
@handles_errors
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default 127.0.0.1; others need a token)"),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default 8000)"),
    db: Optional[str] = DbOpt,
    workers: Optional[int] = typer.Option(None, "--workers", help="Embedded tuning workers (default: 1 on SQLite, 0 on PostgreSQL)"),
    http_workers: Optional[int] = typer.Option(None, "--http-workers", help="uvicorn worker processes"),
    kernel_dir: Optional[list[Path]] = typer.Option(None, "--kernel-dir", help="Register the kernel files of this directory (repeatable)"),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log"),
    worker_arg: Optional[list[str]] = typer.Option(None, "--worker-arg", hidden=True, help="Passed to the embedded workers (tests)"),
) -> None:
    """Run the tuning service: the REST API (/api/v1, docs at /docs) and, on SQLite, a worker."""
    from .server.config import load_settings
    from .server.service import serve as run_server

    settings = load_settings(host=host, port=port, db=db, workers=workers, http_workers=http_workers,
                             kernel_dirs=[p.resolve() for p in kernel_dir] if kernel_dir else None)  # fmt: skip
    run_server(settings, worker_args=list(worker_arg or []), access_log=access_log)


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
    runner: str = typer.Option("auto", "--runner", hidden=True, help="auto, local, dummy (test double) or none"),
    builder: str = typer.Option("local", "--builder", hidden=True, help="local, verify-only or fake"),
    space_kind: str = typer.Option("kernel", "--space", hidden=True, help="kernel or fake"),
    runner_delay: float = typer.Option(0.0, "--runner-delay", hidden=True),
    exit_when_idle: bool = typer.Option(False, "--exit-when-idle", hidden=True),
    settings_stdin: bool = typer.Option(False, "--settings-stdin", hidden=True, help="Settings as JSON on stdin (serve's workers)"),
) -> None:
    """Run jobs from the service's queue on this machine's GPU (one worker per GPU)."""
    from .server.config import load_settings
    from .server.service import read_worker_settings, run_worker
    from .server.worker import WorkerOptions

    if jobs < 1:
        raise _fail("--jobs must be >= 1")
    overrides = dict(db=db, drain_timeout=drain_timeout, heartbeat_interval=heartbeat, grace_period=grace, poll_interval=poll)
    settings = read_worker_settings(sys.stdin, **overrides) if settings_stdin else load_settings(**overrides)
    options = WorkerOptions(gpu=gpu, runner=runner, builder=builder, space=space_kind, jobs=jobs, compile_timeout=compile_timeout,
                            run_timeout=run_timeout, runner_delay=runner_delay, exit_when_idle=exit_when_idle)  # fmt: skip
    run_worker(settings, options)


@token_app.command("create")
@handles_errors
def token_create(
    name: str = typer.Option("default", "--name", help="A label for listings"),
    scope: Optional[list[str]] = typer.Option(None, "--scope", help="read, jobs:write, kernels:upload, admin (repeatable; default read,jobs:write)"),
    db: Optional[str] = DbOpt,
) -> None:
    """Create an API token and print it, once: only its hash is stored."""
    from .server.security import display_prefix, generate_token, hash_token, parse_scopes
    from .store import open_store
    from .store.registry import Registry

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
    from .store import open_store
    from .store.registry import Registry

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
    from .store import open_store
    from .store.registry import Registry

    with open_store(db) as store:
        n = Registry(store).revoke_token(ident)
    if not n:
        raise _fail(f"no active token {ident!r}", EXIT_NOT_FOUND)
    out.print(f"revoked {n} token(s)")


# --- entry point --------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """``ws-tune FILE ...`` is short for ``ws-tune tune FILE ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands} | {"db"} | {
        g.name for g in app.registered_groups if g.name
    }
    if args and not args[0].startswith("-") and args[0] not in commands:
        args.insert(0, "tune")
    app(args=args, prog_name="ws-tune")
