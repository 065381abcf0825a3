"""Outputs a kernel adds into (RESET_TO_ZERO): zeroed before every launch, as
triton.autotune's reset_to_zero; what the correctness check's NaN fill would
otherwise break (split-K with atomics)."""

from __future__ import annotations

import pytest
import torch
from test_cli import ws_tune

from ws_tuner.kernel import KernelFileError, load_kernel


def test_an_accumulated_output_is_zeroed_before_every_launch(data_dir):
    spec = load_kernel(data_dir / "splitk_gemm.py")
    assert spec.reset_to_zero == (2,)
    a, b = torch.ones(4, 8), torch.ones(8, 4)
    c = torch.full((4, 4), float("nan"))  # as the correctness check leaves it

    def kernel(a, b, c):  # a split-K kernel: two halves of K added into C
        c += a[:, :4] @ b[:4]
        c += a[:, 4:] @ b[4:]

    for _ in range(3):  # timed launches: the same result each time
        spec.launch(kernel, [a, b, c])
        assert torch.equal(c, torch.full((4, 4), 8.0))


def test_a_plain_kernel_is_launched_as_it_is(data_dir):
    spec = load_kernel(data_dir / "plain_gemm.py")
    assert spec.reset_to_zero == ()
    out = torch.full((2,), float("nan"))
    spec.launch(lambda o: None, [out])
    assert out.isnan().all()  # an element the kernel does not write stays NaN


def test_reset_to_zero_must_name_outputs(tmp_path, data_dir):
    source = (data_dir / "splitk_gemm.py").read_text().replace("RESET_TO_ZERO = [2]", "RESET_TO_ZERO = [0]")
    bad = tmp_path / "bad_reset.py"
    bad.write_text(source)
    with pytest.raises(KernelFileError, match=r"RESET_TO_ZERO must list entries of OUTPUTS \[2\], got \[0\]"):
        load_kernel(bad)


def test_outputs_that_name_an_input_are_one_line_and_exit_2(tmp_path, data_dir):
    """Attention with a sink takes the sinks after its output: without OUTPUTS, the default
    (the last argument) names the sinks, which the correctness check fills with NaN, and
    every lowering, tilelang's own included, reads WRONG (as on the H200, run 27). The
    kernel never writes them: ws-tune says so before building anything."""
    source = (data_dir / "sink_attn.py").read_text()
    assert "OUTPUTS = [3]" in source
    bad = tmp_path / "sink_no_outputs.py"
    # read through arithmetic (a TVM call) too: what reads a buffer does not write it
    assert "sinks[i] = Sinks[by]" in source
    bad.write_text(source.replace("OUTPUTS = [3]", "").replace("sinks[i] = Sinks[by]", "sinks[i] = T.exp2(Sinks[by])"))
    shape = "batch=1,heads=2,seq_q=256,seq_kv=256"
    db = f"sqlite:///{tmp_path / 'r.db'}"
    for args in (["space", str(bad), "--shape", shape], [str(bad), "--shape", shape, "--compile-only", "--budget", "1", "--db", db]):
        proc = ws_tune(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == "error: sink_no_outputs.py: OUTPUTS [-1] names Sinks, which the kernel never writes"
    assert load_kernel(data_dir / "sink_attn.py").outputs == (3,)


def test_every_output_type_is_poisoned_before_the_check():
    """The correctness check fills outputs first, so that an element the kernel forgets to
    write shows: NaN where the type has one, else the integer type's largest value (an
    int8 GEMM's int32 C; filling it with NaN raised, and every BitNet candidate, its seed
    included, failed at launch on the H200, run 36)."""
    from ws_tuner.gpu import poison

    floats, ints, small = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int8)
    for out in (floats, ints, small):
        poison(out)
    assert torch.isnan(floats).all()
    assert (ints == 2**31 - 1).all() and (small == 127).all()


def test_each_output_has_its_own_tolerance(tmp_path, data_dir):
    """Top-k indices must match (up to ties, which the reference accepts): two indices
    swapped are 0.6% off in norm, under the 1e-2 that the scores beside them get."""
    from ws_tuner.gpu import relative_error

    spec = load_kernel(data_dir / "indexer_topk.py")
    assert spec.outputs == (3, 4) and spec.tolerances == (0.0, 1e-2) and spec.tolerance == 1e-2
    indices = torch.arange(64, dtype=torch.float32).repeat(4, 1)
    swapped = indices.clone()
    swapped[0, [10, 11]] = swapped[0, [11, 10]]
    scores = torch.rand(4, 64)
    errors = [relative_error(swapped, indices), relative_error(scores * 1.001, scores)]
    assert 0 < errors[0] < 1e-2 and spec.wrong(errors) == f"output 3: relative error {errors[0]:.3g} > 0"
    assert spec.wrong([0.0, errors[1]]) is None and spec.wrong([0.0, float("nan")]).startswith("output 4: relative error nan")
    plain = load_kernel(data_dir / "plain_gemm.py")  # one number for every output, as before
    assert plain.tolerances == () and plain.wrong([0.02]) == "relative error 0.02 > 0.01" and plain.wrong([0.005]) is None
    bad = tmp_path / "bad_tolerance.py"
    bad.write_text((data_dir / "indexer_topk.py").read_text().replace("TOLERANCE = [0, 1e-2]", "TOLERANCE = [1e-2]"))
    with pytest.raises(KernelFileError, match=r"TOLERANCE must be a number >= 0 or one per entry of OUTPUTS \[3, 4\], got \[0.01\]"):
        load_kernel(bad)
