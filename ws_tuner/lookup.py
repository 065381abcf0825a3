"""The Python lookup API: the best stored schedule for (kernel, problem, device).

    from ws_tuner.lookup import best_schedule, compile_best
    kernel = compile_best("examples/gemm.py", {"M": 4096, "N": 4096, "K": 4096})

``compile_best`` falls back to the kernel's own seed schedule when nothing is
stored, so production code always gets a kernel.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from .candidate import Candidate, Lowering
from .kernel import KernelSpec, load_kernel
from .store import Store, StoredTrial, open_store, resolve_db_url
from .task import Task, params_key
from .workload import Environment, WorkloadKey


def current_environment(device: str | None = None) -> Environment:
    """This machine's GPU (read through nvidia-smi, no CUDA context), else compile-only."""
    from . import gpu
    from .runner import gpu_available
    from .tune import compile_only_environment

    env = gpu.environment() if gpu_available() else compile_only_environment()
    return env if device is None else Environment(env.arch, device, env.tilelang_version, env.cuda_version, env.driver_version)


def workload_key(task: Task, *, device: str | None = None, env: Environment | None = None) -> WorkloadKey:
    return WorkloadKey.make(task.spec.name, task.spec.source_hash, task.problem, env or current_environment(device))


def _task(kernel: str | Path | KernelSpec, problem: dict[str, Any] | str) -> Task:
    spec = kernel if isinstance(kernel, KernelSpec) else load_kernel(kernel)
    return Task.make(spec, spec.parse_problem(problem))


def best_trial(
    kernel: str | Path | KernelSpec,
    problem: dict[str, Any] | str,
    *,
    db: str | Store | None = None,
    env: Environment | None = None,
) -> StoredTrial | None:
    """The fastest correct stored result that tilelang can compile (a WS schedule
    or one of tilelang's own lowerings, not the vendor reference), or None."""
    store = store_for(db)
    workload = _workload_of(store, workload_key(_task(kernel, problem), env=env))
    return store.best_compilable(workload_id=workload) if workload is not None else None


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def store_for(db: str | Store | None) -> Store:
    """``db`` itself if a Store, else this process's one Store of the URL (opened on
    first use, kept open: opening a store per lookup costs more than the lookup)."""
    if isinstance(db, Store):
        return db
    url = resolve_db_url(db)
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = open_store(db)
        return store


def fastest_on_device(store: Store, key: WorkloadKey, k: int = 1) -> tuple[WorkloadKey, list[StoredTrial]]:
    """The ``k`` fastest compilable trials of ``key``'s kernel, problem and device, and the
    key they were stored under: ``key`` itself where it has any, else the same device timed
    with another toolchain (read from a machine without that GPU, or since a driver update),
    this tilelang and CUDA first, then the newest."""
    found = store.find_workloads(kernel=key.kernel, source_hash=key.source_hash, problem=key.problem, device=key.device)
    ours = (key.tilelang_version, key.cuda_version)
    for wid, stored in sorted(found, key=lambda w: (w[1] != key, (w[1].tilelang_version, w[1].cuda_version) != ours, -w[0])):
        top = store.top_compilable(workload_id=wid, k=k)
        if top:
            return stored, top
    return key, []


# A workload's id never changes once it exists (workloads are never deleted): remembered
# per store, it saves a query per lookup. One not stored yet is asked for again.
_workload_ids: weakref.WeakKeyDictionary[Store, dict[WorkloadKey, int]] = weakref.WeakKeyDictionary()


def _workload_of(store: Store, key: WorkloadKey) -> int | None:
    with _stores_lock:
        known = _workload_ids.setdefault(store, {})
    found = known.get(key)
    if found is None:
        candidates = store.find_workloads(kernel=key.kernel, source_hash=key.source_hash, problem=key.problem, device=key.device)
        found = next((wid for wid, wkey in candidates if wkey == key), None)
        if found is not None:
            known[key] = found
    return found


def best_schedule(kernel: str | Path | KernelSpec, problem: dict[str, Any] | str, **kw: Any) -> Candidate | None:
    trial = best_trial(kernel, problem, **kw)
    return trial.candidate if trial else None


def compile_best(kernel: str | Path | KernelSpec, problem: dict[str, Any] | str, *, params: dict[str, Any] | None = None, **kw: Any) -> Any:
    """Compile the kernel with its best stored schedule; without one, with its seed
    schedule at ``params`` (default: the first value of each kernel parameter), or
    tilelang's default lowering where the kernel has no seed there."""
    from . import compiler

    task = _task(kernel, problem)
    candidate = best_schedule(task.spec, task.problem, **kw)
    if candidate is None:
        params = params or {k: v[0] for k, v in task.spec.params.items()}
        point = params_key(params)
        seed = task.space().seed_candidate(point)
        if isinstance(seed, str) and not task.space().serves(point):
            raise compiler.CompilerError(f"no stored schedule, and the seed at {params} is invalid: {seed}")
        candidate = seed if isinstance(seed, Candidate) else Candidate.make(params, lowering=Lowering.DEFAULT)
    func, configs = task.lowered(candidate)
    return compiler.compile_kernel(func, configs)
