"""On a Hopper GPU: every kernel-side variant of the example kernels computes
the right result with its seed schedule, checked by ws-tune's own isolated
runner against the kernel file's reference; and the vendor baselines agree
with the reference where their backend runs.

Skipped where no NVIDIA GPU is visible (tests/conftest.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate
from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ATTENTION_PROBLEMS = [
    {"B": 2, "H": 8, "S": 2048, "D": 128, "causal": 0, "dtype": "float16"},
    {"B": 2, "H": 8, "S": 2048, "D": 128, "causal": 1, "dtype": "bfloat16"},
    {"B": 2, "H": 8, "S": 2048, "D": 64, "causal": 1, "dtype": "float16"},
    {"B": 2, "H": 8, "S": 2048, "D": 64, "causal": 0, "dtype": "bfloat16"},
    # Tails: S a multiple of no block size (TMA clips rows past S; the last key block is masked).
    {"B": 1, "H": 4, "S": 1000, "D": 64, "causal": 0, "dtype": "float16"},
    {"B": 1, "H": 4, "S": 1000, "D": 128, "causal": 1, "dtype": "float16"},
]
GEMM_PROBLEMS = [
    {"M": 2048, "N": 2048, "K": 4096, "dtype": "float16", "b_layout": "row"},
    {"M": 2048, "N": 2048, "K": 4096, "dtype": "bfloat16", "b_layout": "col"},
]
GEMM_PARAMS = {"block_M": 128, "block_N": 256, "block_K": 64, "swizzle": 8}


def attention_variants(spec, problem):
    """Each (mma, consumers, stages, persistent) at the first block sizes check()
    allows; three consumer warpgroups (block_M 192) where check() allows them; and
    reduce="lane" with each mma and tile walk, with exp="poly" and without;
    warpgroups that alternate at the tensor cores, two and three of them; and the
    sync form in the program's own order, with each consumer form."""
    for mma, consumers, stages, persistent in itertools.product(("sync", "async"), ("cooperative", "pingpong"), (1, 2), (False, True)):
        for block_N in (128, 64):
            params = {"block_M": 128, "block_N": block_N, "stages": stages, "mma": mma, "consumers": consumers, "persistent": persistent}
            if spec.check(problem, params, None) is None:
                yield params
                break
    for mma in ("sync", "async"):
        params = {"block_M": 192, "block_N": 128, "stages": 2, "mma": mma, "consumers": "cooperative"}
        if spec.check(problem, params, None) is None:
            yield params
    for mma, persistent in itertools.product(("sync", "async"), (False, True)):  # the row max and sum as per-lane partials
        params = {"block_M": 128, "block_N": 128, "stages": 2, "mma": mma, "consumers": "cooperative", "persistent": persistent, "reduce": "lane"}
        if spec.check(problem, params, None) is None:
            yield params
            # A quarter of the exponentials as a polynomial on the FMA pipe, masked (-inf) scores included.
            yield {**params, "exp": "poly"}
    for mma, block_M, persistent in (("sync", 128, True), ("async", 128, True), ("sync", 192, False), ("async", 192, False)):
        # The role's warpgroups taking turns at the tensor cores (two, or three at block_M 192).
        params = {"block_M": block_M, "block_N": 128, "stages": 2, "mma": mma, "consumers": "alternating", "persistent": persistent, "reduce": "lane"}
        if spec.check(problem, params, None) is None:
            yield params
    for consumers, block_M, block_N, persistent in (("cooperative", 192, 128, False), ("cooperative", 192, 128, True), ("pingpong", 128, 64, True),
                                                    ("alternating", 128, 128, False)):  # fmt: skip
        params = {"block_M": block_M, "block_N": block_N, "stages": 2, "mma": "sync", "consumers": consumers,
                  "persistent": persistent, "reduce": "lane", "exp": "ftz", "order": "plain"}  # fmt: skip
        if spec.check(problem, params, None) is None:
            yield params


def gemm_variants():
    for mma, persistent, epilogue, split in itertools.product(("sync", "async"), (False, True), ("direct", "smem"), ("square", "rows")):
        yield {**GEMM_PARAMS, "mma": mma, "persistent": persistent, "epilogue": epilogue, "split": split}
    for mma, persistent, epilogue in itertools.product(("sync", "async"), (False, True), ("direct", "smem")):  # one warpgroup per 128x128 tile
        yield {**GEMM_PARAMS, "block_N": 128, "mma": mma, "consumers": "pingpong", "persistent": persistent, "epilogue": epilogue}


def seed_inputs(path, problems, variants):
    """RunInputs of the seed schedule of every variant, built first in a process pool."""
    spec = load_kernel(path)
    out = []
    for problem in problems:
        for params in variants(spec, problem):
            _, seed = compiler.prepare(spec.build(problem, params))
            if spec.check(problem, params, seed):
                continue
            out.append(RunInput(str(spec.path), spec.source_hash, problem, Candidate.make(params, seed), EvaluatorConfig(checks=2, timeout=120)))
    with LocalBuilder(jobs=14, timeout=900) as builder:
        for ri, built in zip(out, builder.build([BuildInput(ri.kernel_path, ri.source_hash, ri.problem, ri.candidate) for ri in out])):
            assert built.status is Status.BUILT, (ri.problem, ri.candidate.param_dict, built.message)
    return out


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(0) as r:
        yield r


@pytest.mark.parametrize(
    "path, problems, variants",
    [
        (EXAMPLES / "attention.py", ATTENTION_PROBLEMS, attention_variants),
        (EXAMPLES / "gemm.py", GEMM_PROBLEMS, lambda spec, problem: gemm_variants()),
    ],
    ids=["attention", "gemm"],
)
def test_every_variant_is_correct(runner, path, problems, variants):
    inputs = seed_inputs(path, problems, variants)
    assert len(inputs) >= 8
    failures = []
    for ri in inputs:
        result = runner.submit(ri).result()
        print(f"{path.stem} {ri.problem} {ri.candidate.param_dict}: {result.status.value} error={result.info.get('max_rel_error')} "
              f"{result.tflops or 0:.0f} TFLOP/s {result.message}")  # fmt: skip
        if result.status is not Status.OK:
            failures.append((ri.problem, ri.candidate.param_dict, result.status.value, result.message))
    assert not failures


@pytest.mark.parametrize("path, problem", [(EXAMPLES / "attention.py", ATTENTION_PROBLEMS[0]), (EXAMPLES / "gemm.py", GEMM_PROBLEMS[1])])
def test_vendors_agree_with_the_reference(path, problem):
    import torch

    spec = load_kernel(path)
    args = spec.inputs(problem, "cuda")
    expected = [e.float() for e in spec.reference(problem, args)]
    ran = []
    for name, fn in spec.module.vendors(problem).items():
        try:
            got = fn(args)
        except RuntimeError as exc:  # this backend cannot run the problem: recorded as failed
            print(f"{name}: unavailable: {str(exc).splitlines()[0]}")
            continue
        error = max(((g.float() - e).norm() / e.norm()).item() for g, e in zip(got, expected))
        print(f"{name}: relative error {error:.2e}")
        assert error < spec.tolerance, name
        ran.append(name)
    torch.cuda.synchronize()
    assert ran and (path.stem != "attention" or "sdpa_flash" in ran)
