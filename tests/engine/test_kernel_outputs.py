"""Outputs a kernel adds into (RESET_TO_ZERO): zeroed before every launch, as
triton.autotune's reset_to_zero; what the correctness check's NaN fill would
otherwise break (split-K with atomics)."""

from __future__ import annotations

import pytest
import torch

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
