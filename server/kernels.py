"""Kernel sources as the server sees them: text to store, never code to run.

The server registers the ``*.py`` files of its kernel directories by name and
stores uploaded sources, content-addressed. It reads a registered file's
``PROBLEM`` and ``CHOICES`` *literals* from its syntax tree (``ast``), so that
a problem can be checked with ``KernelSpec.parse_problem`` at submission;
nothing is imported or executed. An uploaded source is only checked to be
Python (off the server's event loop and out of its process: ``SyntaxChecker``);
its problem arguments are checked for syntax, and the worker that loads it
reports anything else on the job.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import re
import resource
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from pebble import ProcessExpired, ProcessPool

from .. import sandbox
from ..kernel import KernelFileError, KernelSpec, parse_assignments

_log = logging.getLogger(__name__)

# A kernel's name is its file's stem on the workers, and part of the workload key.
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_PROBLEM_KEYS = 32
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # problem and parameter integers fit 64 bits (and every JSON reader)


def check_number(what: str, value: Any) -> Any:
    """``value`` unless it is an integer beyond 64 bits or a float that is not finite."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"{what} is out of range (integers must fit 64 bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    return value


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"kernel name {name!r} must be a Python identifier of at most 64 characters")
    return name


def check_syntax(source: str, name: str) -> None:
    """Reject what is not Python source; parsing is not running."""
    try:
        ast.parse(source, filename=f"{name}.py")
    except SyntaxError as exc:
        raise ValueError(f"kernel source does not parse: line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"kernel source does not parse: {type(exc).__name__}") from None


class CheckerBusy(RuntimeError):
    """Too many uploads are being checked at once; the client should retry."""


class SyntaxChecker:
    """Checks uploaded sources in a few spawned processes, each bounded in time
    and memory. Parsing a crafted megabyte of Python takes seconds and hundreds
    of MiB: in the server's process it would hold the GIL (every request waits)
    and keep the memory. At most ``max_pending`` checks wait; more get CheckerBusy."""

    def __init__(self, workers: int, timeout: float, memory_bytes: int, max_pending: int = 32) -> None:
        self.workers, self.timeout, self.memory_bytes = workers, timeout, memory_bytes
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPool:
        return ProcessPool(max_workers=self.workers, max_tasks=100, context=sandbox.spawn_context(),
                           initializer=_limit, initargs=(self.memory_bytes,))  # fmt: skip

    def check(self, source: str, name: str) -> None:
        """Like ``check_syntax``: ValueError (one line) when the source is not Python."""
        if not self._slots.acquire(blocking=False):
            raise CheckerBusy("too many kernel sources are being checked; try again shortly")
        try:
            with self._lock:
                if not self._pool.active:  # broken (a child that could not start): start afresh
                    self._pool = self._new_pool()
                future = self._pool.schedule(_check_in_child, args=(source, name), timeout=self.timeout)
            try:
                error = future.result()
            except FutureTimeout:
                error = f"kernel source took more than {self.timeout:g} s to parse"
            except ProcessExpired:
                error = "kernel source is too complex to parse (the check ran out of memory)"
            except Exception as exc:  # noqa: BLE001 - the pool itself failed: not the upload's fault
                _log.error("the upload checker failed: %s: %s", type(exc).__name__, exc)
                raise CheckerBusy("the upload checker is unavailable; try again shortly") from None
        finally:
            self._slots.release()
        if error is not None:
            raise ValueError(error)

    def close(self) -> None:
        with self._lock:
            self._pool.stop()
            self._pool.join(timeout=5)


def _limit(memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(10)  # the server's own requests come first on a busy machine


def _check_in_child(source: str, name: str) -> str | None:
    try:
        check_syntax(source, name)
    except ValueError as exc:
        return str(exc)
    return None


def problem_signature(source: str) -> dict[str, Any] | None:
    """``{"defaults": PROBLEM, "choices": CHOICES}`` from top-level literal
    assignments, or None when PROBLEM is not a plain literal."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target in ("PROBLEM", "CHOICES", "PARAMS"):
                try:
                    found[target] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    found[target] = None
    problem, choices = found.get("PROBLEM"), found.get("CHOICES") or {}
    if not isinstance(problem, dict) or not isinstance(choices, dict):
        return None
    try:
        json.dumps([problem, choices])
    except (TypeError, ValueError):
        return None
    params = found.get("PARAMS")
    return {
        "defaults": problem,
        "choices": {k: list(v) for k, v in choices.items() if isinstance(v, (list, tuple))},
        # Only the names: pinned parameters are checked against them at submission.
        "params": sorted(params) if isinstance(params, dict) else None,
    }


def check_params(params: str | None, signature: dict[str, Any] | None) -> str | None:
    """Pinned parameters ("block_M=128,swizzle=8"): syntax, and names when known."""
    if params is None or not params.strip():
        return None
    try:
        pinned = parse_assignments(params, what="params")
    except KernelFileError as exc:
        raise ValueError(str(exc)) from None
    known = signature.get("params") if signature else None
    if known is not None:
        unknown = sorted(set(pinned) - set(known))
        if unknown:
            raise ValueError(f"unknown kernel parameter {unknown[0]!r}; the kernel takes {', '.join(known)}")
    for key, value in pinned.items():
        if re.fullmatch(r"[+-]?\d+", value):
            check_number(f"parameter {key}", int(value))
    return ",".join(f"{k}={v}" for k, v in pinned.items())


def scan(dirs: list[Path]) -> list[tuple[str, str, Path]]:
    """(name, source, path) of every kernel file in ``dirs``; unreadable ones are skipped with a warning."""
    out: list[tuple[str, str, Path]] = []
    for directory in dirs:
        if not directory.is_dir():
            _log.warning("kernel directory %s does not exist", directory)
            continue
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_") or not _NAME.match(path.stem):
                continue
            try:
                out.append((path.stem, path.read_bytes().decode("utf-8"), path))
            except (OSError, UnicodeDecodeError) as exc:
                _log.warning("skipping kernel file %s: %s", path, exc)
    return out


def _scalar(key: str, value: Any) -> Any:
    if not _KEY.match(key):
        raise ValueError(f"problem argument name {key!r} is not an identifier")
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        if not value or len(value) > 256:
            raise ValueError(f"problem argument {key} needs a value of 1 to 256 characters")
        try:
            return int(value)
        except ValueError:
            pass
        try:
            number = float(value)
        except ValueError:
            return value
        return number if math.isfinite(number) else value  # "nan", "inf", 1e999: text, not numbers
    raise ValueError(f"problem argument {key} must be a number or a string")


def _parse_given(problem: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(problem, str):
        text = problem.strip()
        if text.startswith("{"):
            try:
                problem = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError("problem is neither KEY=VALUE pairs nor a JSON object") from None
            if not isinstance(problem, dict):
                raise ValueError("problem must be a JSON object")
        else:
            try:
                problem = dict(parse_assignments(text, what="problem"))
            except KernelFileError as exc:
                raise ValueError(str(exc)) from None
    if not problem:
        raise ValueError("problem is empty; give its arguments, e.g. M=4096,N=4096,K=4096")
    if len(problem) > MAX_PROBLEM_KEYS:
        raise ValueError(f"problem has more than {MAX_PROBLEM_KEYS} arguments")
    return {k: v for k, v in problem.items()}


def normalize_problem(name: str, problem: str | dict[str, Any], signature: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """The problem to store and whether it was fully checked.

    With a registered kernel's PROBLEM: ``KernelSpec.parse_problem`` (defaults
    filled in, types and choices enforced) -> the canonical problem a workload
    key holds. Without one: syntax only (names, scalar values)."""
    given = _parse_given(problem)
    for key, value in given.items():
        given[key] = _scalar(str(key), value) if isinstance(value, str) else value
        _scalar(str(key), given[key])
        check_number(f"problem argument {key}", given[key])
    if signature is None:
        return given, False
    defaults = signature["defaults"]
    spec = KernelSpec(
        name=name, path=Path(f"{name}.py"), source_hash="", problem_defaults=defaults,
        choices={k: tuple(v) for k, v in signature.get("choices", {}).items()}, params={},
    )  # fmt: skip
    try:
        full = spec.parse_problem({k: (str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in given.items()})
    except KernelFileError as exc:
        raise ValueError(str(exc).replace("--shape", "problem")) from None
    for key, value in full.items():
        default = defaults.get(key)
        want = int if default is None else type(default)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            full[key] = float(value)
        elif not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ValueError(f"problem argument {key}={value!r} should be {want.__name__}")
        check_number(f"problem argument {key}", full[key])
    return full, True
