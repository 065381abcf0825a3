"""Where kernel-file code runs, and how the processes that hold secrets keep them.

A kernel file is code: importing it runs it, and over the service it is
anyone's upload. It runs only in processes started from ``spawn_context()``
(``Task.isolated``, the builder's compile pool, the GPU runner): fresh
interpreters whose environment is an allow-list of what compilers and the GPU
need (PATH, HOME, CUDA_*, TVM_* and TILELANG_* caches, ...), never the
service's settings, a database URL, a token or proxy credentials. They get
their inputs and return their answers over multiprocessing's pipe.

A process that does hold secrets (a service worker, the API server) calls
``seal_process()`` once its settings are read: it drops everything but the
allow-list from its own environment, which any other process it starts
inherits (multiprocessing's resource tracker, nvidia-smi), and makes itself
non-dumpable, so that code running as the same user can read neither its
``/proc/<pid>/environ`` (the environment it was started with) nor its memory,
nor attach a debugger to it.

What this does not stop (see README, "Security"): a kernel runs as the user of
the worker, so it can read whatever files that user can (a SQLite database, a
config file, ~/.pgpass), and any process's command line.
"""

from __future__ import annotations

import ctypes
import io
import multiprocessing
import multiprocessing.context
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from multiprocessing import popen_spawn_posix, reduction, resource_tracker, spawn, util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pebble import ProcessPool

# What compilers, CUDA, TVM/TileLang and torch read; nothing else passes.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH", "CC", "CXX", "CUDACXX", "XDG_CACHE_HOME", "ROCM_PATH", "NVSHMEM_HOME",
})  # fmt: skip
ALLOWED_PREFIXES = (
    "LC_", "CUDA_", "NVIDIA_", "NVCC_", "CUBLAS_", "CUDNN_", "TVM_", "TL_", "TILELANG_", "TORCH_", "TORCHINDUCTOR_",
    "PYTORCH_", "TRITON_", "OMP_", "MKL_", "OPENBLAS_",
)  # fmt: skip
_PR_SET_DUMPABLE = 4


def allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def clean_environment(environ: Mapping[str, str] | None = None, *, keep: Iterable[str] = ()) -> dict[str, str]:
    """The allow-listed part of ``environ`` (default: this process's), plus the names in ``keep``."""
    environ = os.environ if environ is None else environ
    kept = set(keep)
    return {k: v for k, v in environ.items() if allowed(k) or k in kept}


def seal_process(*, keep: Iterable[str] = ()) -> bool:
    """Drop all but the allow-list (and ``keep``) from this process's environment
    and make it non-dumpable. Returns whether the kernel accepted the latter (Linux)."""
    kept = clean_environment(keep=keep)
    for name in [n for n in os.environ if n not in kept]:
        del os.environ[name]  # unsetenv: processes started from now on inherit the rest only
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def is_dumpable() -> bool:
    if not sys.platform.startswith("linux"):
        return True
    return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 1  # PR_GET_DUMPABLE


class _CleanPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn launcher, with the child's environment chosen here
    rather than inherited: ``_launch`` is popen_spawn_posix's, save for the exec."""

    def _launch(self, process_obj: Any) -> None:
        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self._child = subprocess.Popen(
                cmd, executable=spawn.get_executable(), env=clean_environment(), pass_fds=sorted(self._fds),
                close_fds=True, restore_signals=False,
            )  # fmt: skip
            self.pid = self._child.pid
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        # subprocess reaps the child (it would otherwise reap it behind our back, later).
        if self.returncode is None:
            self.returncode = self._child.poll() if flag == os.WNOHANG else self._child.wait()
        return self.returncode


class _CleanProcess(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _CleanPopen:
        return _CleanPopen(process_obj)


class _CleanContext(multiprocessing.context.SpawnContext):
    Process = _CleanProcess


_CONTEXT = _CleanContext()


def spawn_context() -> multiprocessing.context.BaseContext:
    """A multiprocessing context whose processes are spawned with ``clean_environment()``
    (for ProcessPoolExecutor's ``mp_context`` and pebble's ``context``)."""
    return _CONTEXT


STOP_WAIT_S = 10.0  # how long closing a pool waits for its stopped threads, past the drain


def close_pool(pool: ProcessPool, drain_s: float) -> None:
    """Let a pebble pool's running tasks finish for up to ``drain_s``, then stop its
    workers; return within ``drain_s + STOP_WAIT_S`` whatever pebble does.

    pebble's joins are unbounded once a pool stops (``join(timeout)`` of a closed
    pool whose queue has drained stops and joins without one), and under load its
    task scheduler thread was seen still waiting for a task after the workers were
    gone: an interrupted tuning hung on exit. The workers are stopped before that
    wait and pebble's threads are daemons, so past the bound the close is left
    behind in a daemon thread of its own.
    """

    def close() -> None:
        pool.close()
        try:
            pool.join(timeout=drain_s)
        except TimeoutError:  # a task still running (an interrupted tuning, a hung kernel): stopped below
            pass
        pool.stop()
        pool.join()

    closer = threading.Thread(target=close, name="ws-tune-pool-close", daemon=True)
    closer.start()
    closer.join(drain_s + STOP_WAIT_S)
