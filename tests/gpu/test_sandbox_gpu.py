"""On a Hopper GPU: the runner's worker checks and times a real kernel in its
clean environment (sandbox.py), and the kernel file sees no secret there.

Skipped where no NVIDIA GPU is visible (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.task import Task

pytestmark = pytest.mark.gpu

GEMM_PARAMS = {"block_K": 64, "block_M": 128, "block_N": 256, "epilogue": "direct", "persistent": False, "swizzle": 8}
SECRETS = {"WS_TUNE_DB": "postgresql://u:db-secret-5e@h/db", "WS_TUNE_BOOTSTRAP_TOKEN": "tok-secret-8c",
           "HTTPS_PROXY": "http://u:proxy-secret-1d@p:3128"}  # fmt: skip


def test_runner_times_a_real_kernel_without_secrets(tmp_path: Path, example_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    seen = tmp_path / "seen.json"
    recording = tmp_path / "gemm_recording.py"  # the example, noting at import what its process can see
    recording.write_text(f"import json as _j, os as _o\n_j.dump(dict(_o.environ), open({str(seen)!r}, 'w'))\n"
                         + example_path.read_text())  # fmt: skip
    spec = load_kernel(recording)
    task = Task.make(spec, spec.parse_problem("M=4096,N=4096,K=4096"))
    candidate = task.space().seed_candidate(tuple(sorted(GEMM_PARAMS.items())))
    seen.unlink()  # written by the load above, in this process; the runner's worker writes it again
    run = RunInput(str(recording), spec.source_hash, task.problem, candidate, EvaluatorConfig(timeout=120))
    with LocalRunner(0) as runner:
        result = runner.submit(run).result()
    assert result.status is Status.OK, result.message
    assert result.timing is not None and result.timing.median_ms > 0
    environ = json.loads(seen.read_text())
    assert not [k for k, v in environ.items() if "secret" in v] and not [k for k in environ if k.startswith("WS_TUNE_")]
    assert environ["CUDA_VISIBLE_DEVICES"] == "0"
