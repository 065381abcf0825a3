"""The lookup API on a CPU: what compile_best falls back to with nothing stored."""

from __future__ import annotations

import pytest

from ws_tuner import lookup

SPLITK = {"block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 3, "split_k": 2}


@pytest.mark.slow
def test_compile_best_of_a_kernel_without_a_seed_is_tilelangs_default_lowering(tmp_path, data_dir):
    """DeepSeek's mHC pre-mixing has no seed (its 96 threads split by hand by thread index;
    role_based asks for whole warpgroups): with nothing stored, compile_best gives tilelang's
    default lowering at the parameters, not an error."""
    params = {"hidden_block": 256, "num_stages": 1, "threads": 96}
    kernel = lookup.compile_best(data_dir / "mhc_pre.py", "tokens=1024", params=params, db=f"sqlite:///{tmp_path / 'r.db'}")
    source = kernel.get_kernel_source()
    # the default lowering: the kernel as tilelang lowers it, without a schedule's register budgets
    assert "mhc_pre_kernel(" in source and "warpgroup_reg_alloc" not in source


@pytest.mark.slow
def test_compile_best_of_a_kernel_with_atomics_is_its_seed(tmp_path, data_dir):
    """Split-K with atomics: role_based skips atomics, ws-tune seeds it through a stand-in
    (compiler.prepare), so with nothing stored compile_best gives the seed schedule, its
    atomics in the MMA's role."""
    kernel = lookup.compile_best(data_dir / "splitk_gemm.py", "M=4096,N=4096,K=8192", params=SPLITK, db=f"sqlite:///{tmp_path / 'r.db'}")
    source = kernel.get_kernel_source()
    assert "AtomicAdd" in source and "warpgroup_reg_alloc" in source


def test_compile_best_refuses_parameters_the_kernel_does_not_serve(tmp_path, data_dir):
    from ws_tuner.compiler import CompilerError

    with pytest.raises(CompilerError, match="the seed at .* is invalid: kernel: K is not a multiple of split_k"):
        lookup.compile_best(data_dir / "splitk_gemm.py", "M=4096,N=4096,K=8192", params={**SPLITK, "split_k": 3}, db=f"sqlite:///{tmp_path / 'r.db'}")
