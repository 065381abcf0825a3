"""What the commands share: the app, consoles, options, one-line errors, loading a task."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
db_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Database schema commands.")
token_app = typer.Typer(add_completion=False, no_args_is_help=True, help="API tokens of the service.")


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"ws-tune {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print ws-tune's version and exit"),
) -> None:
    """Options before the command."""


app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")

# No markup: what is printed holds user text (kernel names, error messages, candidate
# labels "[default] ...", T.WSSchedule code with "[buffer]" lists) that rich would
# read as style tags and drop. The few styled lines ask for markup themselves.
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 1

ShapeOpt = typer.Option(None, "--shape", "-s", help="Problem arguments, e.g. M=4096,N=4096,K=4096[,dtype=bfloat16]; those the file's PROBLEM gives a default may be left out")
ParamOpt = typer.Option(None, "--param", "-p", help="Pin kernel parameters, e.g. block_M=128,swizzle=8")
SpaceOpt = typer.Option(None, "--space", help="Axis values of the schedule space, as TOML (see configs/space-focused.toml)")


def _check_db(value: Optional[str]) -> Optional[str]:
    """--db, else $WS_TUNE_DB, checked before anything is opened (a typo never becomes a new file)."""
    from ..database_url import check_db_url

    given, what = (value, "--db") if value else (os.environ.get(DB_ENV) or None, DB_ENV)
    if not given:
        return None
    try:
        return check_db_url(given, what)
    except ValueError as exc:
        raise _fail(str(exc)) from None


DB_ENV = "WS_TUNE_DB"
DbOpt = typer.Option(None, "--db", callback=_check_db, metavar="URL",
                     help="Database URL (sqlite:///PATH, postgresql://USER@HOST/DB) or SQLite path ending in .db "
                          "(default: $WS_TUNE_DB, else ~/.cache/ws-tune/ws-tune.db)")  # fmt: skip


def rate_text(rate: float) -> str:
    """TFLOP/s or GB/s as a table shows it: whole numbers from 100 up, three significant
    digits below (a memory-bound kernel's few TFLOP/s would read "0")."""
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"


def speed_text(tflops: float, gbps: float | None = None) -> str:
    """A kernel's speed in a line: TFLOP/s, and GB/s where its kernel file says what a call moves."""
    return f"{rate_text(tflops)} TFLOP/s" + (f", {rate_text(gbps)} GB/s" if gbps is not None else "")


def print_error(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    print_error(message)
    return typer.Exit(code)


def _compiler_errors() -> tuple[type[Exception], ...]:
    # Only a loaded compiler can have raised: commands that never touch tilelang
    # (serve, worker, token) then start without importing it (seconds, and torch).
    compiler = sys.modules.get(f"{__package__.rpartition('.')[0]}.compiler")
    return (compiler.CompilerError,) if compiler is not None else ()


def _library_error(exc: BaseException) -> bool:
    """Raised inside an installed library (Optuna, SQLAlchemy, TVM) rather than by ws-tune or
    the user's kernel file on what they were given: a ValueError there is a bug, not bad input."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    where = Path(tb.tb_frame.f_code.co_filename).resolve()
    if where.is_relative_to(Path(__file__).resolve().parents[1]):  # ws_tuner, however it is installed
        return False
    paths = sysconfig.get_paths()
    return any(where.is_relative_to(Path(paths[k]).resolve()) for k in ("purelib", "platlib", "stdlib"))


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures become one line and exit code 2; anything else one line and 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..kernel import KernelFileError
        from ..pipeline import ReferenceFails
        from ..store import StoreError

        try:
            return fn(*args, **kwargs)
        except (KernelFileError, ReferenceFails, StoreError, ValueError, *_compiler_errors()) as exc:
            if isinstance(exc, ValueError) and _library_error(exc):
                _internal(exc)
            raise _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            raise _fail("interrupted", 130) from None
        except Exception as exc:  # noqa: BLE001 - the promise is: no traceback
            _internal(exc)

    return wrapper


def _internal(exc: Exception) -> NoReturn:
    """An error that is ws-tune's: one line and exit 1, or (WS_TUNE_DEBUG) its traceback."""
    if os.environ.get("WS_TUNE_DEBUG"):
        raise exc
    raise _fail(f"internal error: {type(exc).__name__}: {exc}".splitlines()[0] + " (WS_TUNE_DEBUG=1 shows the traceback)", 1) from None


def _task(file: Path, shape: Optional[str], param: Optional[str], space: Optional[Path] = None) -> Any:
    from ..kernel import load_kernel
    from ..space import SpaceConfig
    from ..task import Task

    spec = load_kernel(file)
    config = SpaceConfig.from_toml(space) if space else None
    grid = spec.parse_params(param)
    for key, (value,) in ((k, v) for k, v in grid.items() if v != spec.params[k]):
        if value not in spec.params[key]:  # allowed (a value to try), but likely a typo
            err.print(f"note: --param {key}={value} is not among {spec.name}'s PARAMS ({', '.join(map(str, spec.params[key]))})", markup=False, highlight=False)
    return Task.make(spec, spec.parse_problem(shape), grid, config)


PASSED = (None, "ok", "built")  # statuses that are no failure (None: not measured yet)


# tilelang's errors whose words name nothing of the kernel's, and where runs met them
TILELANG_SEEN = {
    "Downcast from tirx.Sub to ir.IntImm failed": "seen where tilelang's software pipeliner stages a loop whose bounds are computed "
                                                   "at run time: a causal, windowed or variable-length key loop",
}


# What a failure of tilelang's own lowering says of tilelang: one that computes garbage is built.
_TILELANGS_FAULT = {"compile_error": "tilelang cannot build it", "compile_timeout": "tilelang cannot build it", "wrong": "tilelang builds it wrong"}


def failure_lines(trials: list[tuple[str | None, str, str, str | None]]) -> list[str]:
    """Why candidates failed, from (status, message, candidate, lowering) of each trial
    (those that passed, or have no outcome yet, are skipped): for each failing status its
    most common message, how many got it and one of them (a table of outcomes only
    counts them). tilelang's own lowerings are told apart: their failures are tilelang's
    (a kernel its lowering cannot build), not a schedule of ws-tune's."""
    from ..candidate import TILELANG_LOWERINGS

    tilelangs_own = {lw.value for lw in TILELANG_LOWERINGS}
    seen: dict[tuple[str, bool], Counter] = {}
    example: dict[tuple[str, bool, str], str] = {}
    for status, message, candidate, lowering in trials:
        if status not in PASSED and message:
            key = (status, lowering in tilelangs_own)
            seen.setdefault(key, Counter())[message] += 1
            example.setdefault((*key, message), candidate)
    lines = []
    for (status, tilelangs), messages in sorted(seen.items()):
        message, n = messages.most_common(1)[0]
        others = f"; {len(messages) - 1} other message(s)" if len(messages) > 1 else ""
        whose = f" in tilelang's own lowering ({_TILELANGS_FAULT.get(status, 'it fails there')}; not a ws-tune schedule)" if tilelangs else ""
        seen_where = next((f" [{where}]" for words, where in TILELANG_SEEN.items() if words in message), "")
        lines.append(f"{status}{whose}: {n} x {message}{seen_where} (e.g. {example[status, tilelangs, message]}){others}")
    return lines
