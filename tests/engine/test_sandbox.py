"""Kernel-file code gets no secrets: the processes it runs in (Task.isolated, the
builder's compile pool, the GPU runner) start with an allow-listed environment,
and a sealed process (a service worker) keeps its own environment and memory
from them. Real spawned processes; a kernel file that records what it can see."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import KernelFileError
from ws_tuner.result import Status
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "WS_TUNE_DB": "postgresql+psycopg://wstune:db-secret-4f1c@db:5432/wstune",
    "WS_TUNE_BOOTSTRAP_TOKEN": "bootstrap-secret-9a7e",
    "HTTPS_PROXY": "http://me:proxy-secret-22d0@proxy:3128",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-77b1",
    "PGPASSWORD": "pg-secret-31c5",
}
KEPT = {"CUDA_VISIBLE_DEVICES": "3", "TILELANG_CACHE_DIR": "/tmp/tl-cache-kept", "TVM_NUM_THREADS": "2"}
MARKERS = ("secret-",)


def spy_source(out: Path) -> str:
    """A kernel file whose import records its process's environment, then fails."""
    return (
        "import json, os\n"
        f"out = {str(out)!r}\n"
        "seen = {'pid': os.getpid(), 'environ': dict(os.environ),\n"
        "        'raw': open('/proc/self/environ', 'rb').read().decode('latin-1')}\n"
        "json.dump(seen, open(os.path.join(out, f'{os.getpid()}.json'), 'w'))\n"
        "raise RuntimeError('spy done')\n"
    )


@pytest.fixture
def spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    for name, value in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "seen"
    out.mkdir()
    path = tmp_path / "spy.py"
    path.write_text(spy_source(out))
    return path, out


def _seen(out: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert found, "the kernel file never ran"
    return found


def _assert_clean(seen: dict) -> None:
    text = json.dumps(seen)
    assert not [m for m in MARKERS if m in text], {k: v for k, v in seen["environ"].items() if "secret" in v}
    assert not [k for k in seen["environ"] if k.startswith("WS_TUNE_")]
    assert {k: seen["environ"].get(k) for k in KEPT} == KEPT  # what toolchains need still passes
    assert seen["environ"]["PATH"] == os.environ["PATH"] and seen["pid"] != os.getpid()


def _input(path: Path, cls: type = BuildInput, **kw: object) -> BuildInput:
    source_hash = hashlib.sha256(path.read_bytes()).hexdigest()
    return cls(str(path), source_hash, {"M": 1}, Candidate.make({}, None, Lowering.DEFAULT), **kw)


def test_task_isolated_runs_kernel_code_without_secrets(spy: tuple[Path, Path]) -> None:
    path, out = spy
    with pytest.raises(KernelFileError, match="spy done"):
        Task.isolated(str(path), "M=1")
    [seen] = _seen(out)
    _assert_clean(seen)


def test_the_compile_pool_runs_kernel_code_without_secrets(spy: tuple[Path, Path]) -> None:
    path, out = spy
    with LocalBuilder(jobs=1, timeout=120) as builder:
        [result] = builder.build([_input(path)])
    assert result.status is Status.COMPILE_ERROR and "spy done" in result.message
    [seen] = _seen(out)
    _assert_clean(seen)


def test_the_gpu_runner_runs_kernel_code_without_secrets(spy: tuple[Path, Path]) -> None:
    """The runner's worker loads the kernel file before it touches CUDA: no GPU needed here."""
    path, out = spy
    with LocalRunner(gpu=0) as runner:
        result = runner.submit(_input(path, RunInput, config=EvaluatorConfig(timeout=120))).result()
    assert result.status is Status.COMPILE_ERROR and "spy done" in result.message
    [seen] = _seen(out)
    _assert_clean({**seen, "environ": {**seen["environ"], "CUDA_VISIBLE_DEVICES": KEPT["CUDA_VISIBLE_DEVICES"]}})
    assert seen["environ"]["CUDA_VISIBLE_DEVICES"] == "0"  # pinned by the runner, as before


_SEALED = """
import json, os, sys, glob, subprocess
from concurrent.futures import ProcessPoolExecutor
from ws_tuner import sandbox

def peek(pid):
    seen = {}
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            seen[path] = open(path, "rb").read().decode("latin-1")
        except OSError as exc:
            seen[path] = type(exc).__name__
    return seen

if __name__ == "__main__":
    assert sandbox.seal_process() and not sandbox.is_dumpable()
    with ProcessPoolExecutor(1, mp_context=sandbox.spawn_context()) as pool:
        child = pool.submit(peek, os.getpid()).result()
    shell = subprocess.run(["env"], capture_output=True, text=True).stdout
    json.dump({"pid": os.getpid(), "own": dict(os.environ), "child": child, "shell": shell}, sys.stdout)
"""


def test_a_sealed_process_keeps_its_secrets_from_its_children(tmp_path: Path, as_in_a_container: list[str]) -> None:
    """A worker seals itself: its environment is scrubbed (so nothing it starts
    inherits a secret: multiprocessing's resource tracker, nvidia-smi) and it is
    non-dumpable (so a kernel running as the same user cannot read the
    environment it was started with from /proc). Run with a container's
    capabilities: root with CAP_SYS_PTRACE or CAP_SYS_ADMIN reads anything anyway."""
    prefix = as_in_a_container
    env = {**os.environ, **SECRETS, **KEPT, "PYTHONPATH": str(ROOT)}
    script = tmp_path / "sealed.py"
    script.write_text(_SEALED)
    run = subprocess.run([*prefix, sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout)
    assert not [k for k in seen["own"] if k in SECRETS] and {k: seen["own"][k] for k in KEPT} == KEPT
    assert seen["child"][f"/proc/{seen['pid']}/environ"] == "PermissionError"  # its initial environment, sealed
    readable = {p: v for p, v in seen["child"].items() if not v.endswith("Error")}
    assert readable and not [p for p, v in readable.items() if "secret-" in v]  # tracker, pool worker, itself: clean
    assert "secret-" not in seen["shell"]


def test_closing_a_pool_lets_short_tasks_finish_and_stops_a_hung_one_within_its_bound() -> None:
    """An interrupted tuning must exit: close_pool neither waits for a hung task nor for pebble's stopped threads."""
    import multiprocessing
    import time

    from pebble import ProcessPool

    from ws_tuner.sandbox import STOP_WAIT_S, close_pool, spawn_context

    before = set(multiprocessing.active_children())
    pool = ProcessPool(max_workers=2, context=spawn_context())
    short = pool.schedule(time.sleep, args=(0.1,))
    hung = pool.schedule(time.sleep, args=(600,))
    while not hung.running():  # in a worker, not just queued (the short one went first: running or done)
        time.sleep(0.05)
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2
    started = time.monotonic()
    close_pool(pool, drain_s=2)
    assert time.monotonic() - started < 2 + STOP_WAIT_S
    assert short.result(timeout=0) is None
    assert not hung.done() or hung.exception(timeout=0) is not None  # stopped, never finished
    for worker in workers:
        worker.join(timeout=5)
        assert not worker.is_alive()
