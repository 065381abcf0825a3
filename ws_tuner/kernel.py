"""Kernel files: the contract of the file given to ``ws-tune FILE``.

A kernel file is a Python module that defines, at top level:

``PROBLEM: dict[str, object]``
    The problem arguments and their defaults; ``None`` marks one the user
    must give (``--shape M=4096,N=4096,K=4096``). A default's type is the
    argument's type (int, float or str).
``CHOICES: dict[str, list]`` (optional)
    The allowed values of some problem arguments (dtypes, layouts).
``PARAMS: dict[str, list]``
    The kernel's tunable parameters (tile sizes, swizzle, ...) and the
    values to try. The schedule space is crossed with their product.
``kernel(problem: dict, **params) -> PrimFunc``
    Builds the TileLang kernel. It may carry ``T.annotate_ws_schedule`` (its
    seed schedule, with ``T.WSID`` op ids); a plain kernel is seeded by
    tilelang's role_based scheduler instead.
``inputs(problem: dict, device) -> list[torch.Tensor]``
    Every argument of the kernel, outputs included, on ``device``, with
    fresh random values for the inputs.
``OUTPUTS: list[int]`` (optional, default ``[-1]``)
    Indices of the output arguments in that list.
``RESET_TO_ZERO: list[int]`` (optional)
    Outputs the kernel adds into rather than writes (split-K partial sums
    with atomics, ``C += A @ B``): zeroed before every launch of the kernel,
    timed ones included, as ``triton.autotune``'s ``reset_to_zero`` does, so
    that every launch computes the same thing from the same state. (Other
    outputs are filled with NaN before the correctness check, to catch
    elements the kernel forgets to write; these are zeroed after that.)
``reference(problem: dict, args: list[torch.Tensor]) -> list[torch.Tensor]``
    The expected outputs, one per entry of ``OUTPUTS``. It is called after the
    kernel ran on ``args``: where several answers are right (top-k indices
    among tied scores), it may read the kernel's outputs there and accept them.
``flops(problem: dict) -> float``
    Floating-point operations of one call, for TFLOP/s.
``bytes_moved(problem: dict) -> float`` (optional)
    Bytes one call must move to and from global memory at least (each input
    read once, each output written once), for GB/s: what a memory-bound
    kernel is judged by. Reports show GB/s beside TFLOP/s where it is given.
``check(problem: dict, params: dict, schedule) -> str | None`` (optional)
    Why these parameters (and, when not ``None``, this ``ws_tuner.schedule.
    Schedule``) cannot serve this problem, or ``None``; used to prune before
    anything is built. It is asked with ``None``, with the seed at each role
    layout's warp ranges, and with each whole candidate before it is handed
    out. The space itself keeps the seed's data flow (see ws_tuner/seed.py):
    a check need not guard stage orders.
``SCHEDULED_ONLY: dict[str, list]`` (optional)
    Kernel-parameter values whose kernel is right only in the order its seed
    schedule gives it (asynchronous MMA waits the seed places, say):
    tilelang's default and role_based lowerings, which reorder the plain
    program as they see fit, are not built as baselines at such points.
    Also values that change only the seed, not the program: the same
    baselines are built at the parameter's other values.
``TOLERANCE: float | list[float]`` (optional, default 1e-2)
    Largest relative error ``|out - ref| / |ref|`` that counts as correct; a
    list gives one per entry of ``OUTPUTS`` (0 for indices, which must match).
``vendors(problem: dict) -> dict[str, Callable[[list], list]]`` (optional)
    Vendor-library implementations of the same computation, timed as
    baselines beside the kernel: name -> a function taking the kernel's
    argument list (as ``inputs`` returns it) and returning the outputs as
    ``reference`` does (e.g. ``{"cublas": ...}`` for a GEMM, one entry per
    torch SDPA backend for attention). Each is checked against
    ``reference`` like a candidate; one that raises (its backend cannot run
    this problem or is missing) is recorded as failed with its message.
``PASS_CONFIGS: dict`` (optional)
    TileLang pass configs for every build of the kernel, ws-tune's candidates
    and tilelang's own lowerings alike: what ``@tilelang.jit(pass_configs=...)``
    gives, keyed by name (``"tl.enable_fast_math"``) or by
    ``tilelang.PassConfigKey``. The two that choose the warp-specialization
    lowering (``tl.disable_warp_specialized``,
    ``tl.enable_auto_warp_specialization``) are ws-tune's to set, per baseline.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

REQUIRED = ("PROBLEM", "PARAMS", "kernel", "inputs", "reference", "flops")


class KernelFileError(Exception):
    """The kernel file cannot be used; the message is one line."""


@dataclass(frozen=True)
class KernelSpec:
    name: str
    path: Path
    source_hash: str
    problem_defaults: dict[str, Any]
    choices: dict[str, tuple[Any, ...]]
    params: dict[str, tuple[Any, ...]]
    outputs: tuple[int, ...] = (-1,)
    reset_to_zero: tuple[int, ...] = ()
    tolerance: float = 1e-2  # the loosest of ``tolerances``
    tolerances: tuple[float, ...] = ()  # one per output; empty: ``tolerance`` for each
    scheduled_only: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    pass_configs: dict[str, Any] = field(default_factory=dict)  # PASS_CONFIGS, keys as tilelang's names
    module: ModuleType | None = field(default=None, compare=False, repr=False)

    # --- the user's functions, called through one place each ---------------
    def build(self, problem: dict[str, Any], params: dict[str, Any]) -> Any:
        return self._call("kernel", problem, **params)

    def inputs(self, problem: dict[str, Any], device: Any) -> list[Any]:
        return list(self._call("inputs", problem, device))

    def reference(self, problem: dict[str, Any], args: list[Any]) -> list[Any]:
        return list(self._call("reference", problem, args))

    def flops(self, problem: dict[str, Any]) -> float:
        return float(self._call("flops", problem))

    def bytes_moved(self, problem: dict[str, Any]) -> float | None:
        if self.module is None or not hasattr(self.module, "bytes_moved"):
            return None
        return float(self._call("bytes_moved", problem))

    def gbps(self, problem: dict[str, Any], median_ms: float) -> float | None:
        """GB/s of one call taking ``median_ms``, where the file says what it moves."""
        moved = self.bytes_moved(problem)
        return moved / (median_ms * 1e-3) / 1e9 if moved is not None and median_ms > 0 else None

    def wrong(self, errors: list[float]) -> str | None:
        """Why outputs with these relative errors (one per ``OUTPUTS`` entry) are wrong, or None."""
        for i, (error, allowed) in enumerate(zip(errors, self.tolerances or (self.tolerance,) * len(errors))):
            if not error <= allowed:  # NaN fails too
                which = f"output {self.outputs[i]}: " if len(errors) > 1 else ""
                return f"{which}relative error {error:.3g} > {allowed:g}"
        return None

    def launch(self, kernel: Callable[..., Any], args: list[Any]) -> Any:
        """One launch of a compiled kernel on ``args``, from the state ``inputs`` gave them."""
        for i in self.reset_to_zero:
            args[i].zero_()
        return kernel(*args)

    def vendor_names(self, problem: dict[str, Any]) -> list[str]:
        if self.module is None or not hasattr(self.module, "vendors"):
            return []
        return sorted(self._call("vendors", problem))

    def vendor(self, problem: dict[str, Any], name: str) -> Callable[[list[Any]], list[Any]]:
        return self._call("vendors", problem)[name]

    def needs_schedule(self, params: dict[str, Any]) -> bool:
        """Whether tilelang's own lowerings are left out at ``params`` (``SCHEDULED_ONLY``)."""
        return any(params.get(k) in values for k, values in self.scheduled_only.items())

    def check(self, problem: dict[str, Any], params: dict[str, Any], schedule: Any = None) -> str | None:
        if self.module is None or not hasattr(self.module, "check"):
            return None
        return self._call("check", problem, params, schedule)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn: Callable[..., Any] = getattr(self.module, name)
        return fn(*args, **kwargs)

    # --- user input ---------------------------------------------------------
    def parse_problem(self, text: str | dict[str, Any] | None) -> dict[str, Any]:
        """``M=4096,N=4096,K=4096`` (or a dict) -> the full, typed problem."""
        given = parse_assignments(text, what="--shape") if not isinstance(text, dict) else dict(text)
        unknown = sorted(set(given) - set(self.problem_defaults))
        if unknown:
            raise KernelFileError(f"unknown problem argument {unknown[0]!r}; {self.name} takes {', '.join(self.problem_defaults)}")
        problem: dict[str, Any] = {}
        for key, default in self.problem_defaults.items():
            if key not in given:
                if default is None:
                    raise KernelFileError(f"--shape is missing {key} (give {','.join(k + '=...' for k, v in self.problem_defaults.items() if v is None)})")
                problem[key] = default
                continue
            problem[key] = _coerce(key, given[key], default)
            allowed = self.choices.get(key)
            if allowed and problem[key] not in allowed:
                raise KernelFileError(f"{key}={problem[key]} is not one of {', '.join(map(str, allowed))}")
            # the file's own default may be 0 (a window of 0: none), and may be given as it is
            if not self.is_categorical(key) and isinstance(problem[key], int) and problem[key] <= 0 and problem[key] != default:
                raise KernelFileError(f"{key} must be positive, got {problem[key]}")
        return problem

    def is_categorical(self, key: str) -> bool:
        """A flag or a pick from a list (a dtype, a layout, ``causal``), not a size."""
        default = self.problem_defaults.get(key)
        return key in self.choices or isinstance(default, (str, bool))

    def problem_distance(self, a: dict[str, Any], b: dict[str, Any]) -> float | None:
        """Log-distance between two problems that differ only in sizes; None if
        they differ in anything categorical (so a schedule cannot be carried over)."""
        if set(a) != set(b):
            return None
        sizes = [k for k in a if not self.is_categorical(k) and _is_size(a[k]) and _is_size(b[k])]
        if any(a[k] != b[k] for k in a if k not in sizes):
            return None
        return sum(abs(math.log2(max(a[k], 1)) - math.log2(max(b[k], 1))) for k in sizes)

    def parse_params(self, text: str | None) -> dict[str, tuple[Any, ...]]:
        """``block_M=128,swizzle=8`` pins parameters; the rest keep their lists."""
        pinned = parse_assignments(text, what="--param")
        unknown = sorted(set(pinned) - set(self.params))
        if unknown:
            raise KernelFileError(f"unknown kernel parameter {unknown[0]!r}; {self.name} takes {', '.join(self.params)}")
        out = dict(self.params)
        for key, value in pinned.items():
            out[key] = (_coerce(key, value, self.params[key][0]),)
        return out


def parse_assignments(text: str | None, *, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise KernelFileError(f"{what} wants KEY=VALUE pairs separated by commas, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _is_size(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


TRUE, FALSE = ("1", "true", "yes"), ("0", "false", "no")


def _coerce(key: str, value: Any, like: Any) -> Any:
    """Parse a command-line string to the type of ``like`` (required arguments are sizes: int)."""
    if not isinstance(value, str):
        return value
    kind = type(like) if like is not None else int
    if kind is bool:  # anything else is a typo, not False
        if value.lower() not in TRUE + FALSE:
            raise KernelFileError(f"{key}={value!r} is not a boolean (true/false, 1/0, yes/no)")
        return value.lower() in TRUE
    try:
        if kind in (int, float):
            return kind(value)
    except ValueError:
        raise KernelFileError(f"{key}={value!r} is not a number") from None
    return value


def _mapping_of_lists(module: ModuleType, name: str, path: Path) -> dict[str, Any]:
    value = getattr(module, name, {})
    if not isinstance(value, dict) or any(not isinstance(v, (list, tuple)) for v in value.values()):
        raise KernelFileError(f"{path}: {name} must be a dict of lists")
    return value


def load_kernel(path: str | Path) -> KernelSpec:
    """Import a kernel file and check its contract; errors are one line."""
    path = Path(path)
    if not path.is_file():
        raise KernelFileError(f"kernel file {path} does not exist")
    source = path.read_bytes()
    name = path.stem
    # A unique module name per file content: two kernel files named alike do not clash.
    digest = hashlib.sha256(source).hexdigest()
    mod_name = f"ws_tune_kernel_{name}_{digest[:12]}"
    if mod_name in sys.modules:
        module = sys.modules[mod_name]
    else:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise KernelFileError(f"cannot import {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        # As for a script: the file's own folder is importable (shared helpers beside it).
        if str(path.resolve().parent) not in sys.path:
            sys.path.append(str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit too
            del sys.modules[mod_name]
            raise KernelFileError(f"cannot import {path}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise KernelFileError(f"{path} is not a ws-tune kernel file: it lacks {', '.join(missing)} (see ws_tuner/kernel.py)")
    problem, params = module.PROBLEM, module.PARAMS
    if not isinstance(problem, dict) or not isinstance(params, dict):
        raise KernelFileError(f"{path}: PROBLEM and PARAMS must be dicts")
    if any(not isinstance(v, (list, tuple)) or not v for v in params.values()):
        raise KernelFileError(f"{path}: every PARAMS entry must be a non-empty list of values")
    for fn in ("kernel", "inputs", "reference", "flops", "bytes_moved"):
        if hasattr(module, fn) and not callable(getattr(module, fn)):
            raise KernelFileError(f"{path}: {fn} must be a function")
    outputs = tuple(getattr(module, "OUTPUTS", (-1,)))
    reset = getattr(module, "RESET_TO_ZERO", ())
    if not isinstance(reset, (list, tuple)) or any(i not in outputs for i in reset):
        raise KernelFileError(f"{path}: RESET_TO_ZERO must list entries of OUTPUTS {list(outputs)}, got {reset!r}")
    tolerances = _tolerances(getattr(module, "TOLERANCE", 1e-2), outputs, path)
    return KernelSpec(
        name=name,
        path=path.resolve(),
        source_hash=digest,
        problem_defaults=dict(problem),
        choices={k: tuple(v) for k, v in getattr(module, "CHOICES", {}).items()},
        params={k: tuple(v) for k, v in params.items()},
        outputs=outputs,
        reset_to_zero=tuple(reset),
        tolerance=max(tolerances),
        tolerances=tolerances if isinstance(getattr(module, "TOLERANCE", None), (list, tuple)) else (),
        scheduled_only={k: tuple(v) for k, v in _mapping_of_lists(module, "SCHEDULED_ONLY", path).items()},
        pass_configs=_pass_configs(getattr(module, "PASS_CONFIGS", {}), path),
        module=module,
    )


def _pass_configs(value: Any, path: Path) -> dict[str, Any]:
    """PASS_CONFIGS keyed by tilelang's config names, each one tilelang knows, of its type,
    and left to the kernel by ws-tune."""
    from . import compiler  # tilelang's registry of configs; a kernel file imports tilelang anyway

    if not isinstance(value, dict):
        raise KernelFileError(f"{path}: PASS_CONFIGS must be a dict of tilelang pass configs, got {type(value).__name__}")
    configs = {str(getattr(k, "value", k)): v for k, v in value.items()}  # PassConfigKey is an Enum of names
    reason = compiler.pass_configs_refusal(configs)
    if reason:
        raise KernelFileError(f"{path}: PASS_CONFIGS: {reason}")
    return configs


def _tolerances(value: Any, outputs: tuple[int, ...], path: Path) -> tuple[float, ...]:
    """TOLERANCE as one bound per output."""
    given = tuple(value) if isinstance(value, (list, tuple)) else (value,) * len(outputs)
    if len(given) != len(outputs) or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0 for t in given):
        raise KernelFileError(f"{path}: TOLERANCE must be a number >= 0 or one per entry of OUTPUTS {list(outputs)}, got {value!r}")
    return tuple(float(t) for t in given)
