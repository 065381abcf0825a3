"""Problem arguments of a kernel file: sizes, listed choices (an int flag
like ``causal`` included) and the distance that warm starts use."""

from __future__ import annotations

import pytest

from ws_tuner.kernel import KernelFileError, load_kernel


@pytest.fixture(scope="module")
def flash(data_dir):
    return load_kernel(data_dir / "flash_fwd.py")  # D and causal: ints with CHOICES


def test_an_int_with_choices_accepts_every_listed_value(flash):
    assert flash.parse_problem("S=1024,causal=0")["causal"] == 0
    assert flash.parse_problem("S=1024,causal=1,D=128") == {"B": 1, "H": 2, "S": 1024, "D": 128, "causal": 1}
    with pytest.raises(KernelFileError, match="not one of 0, 1"):
        flash.parse_problem("S=1024,causal=2")
    with pytest.raises(KernelFileError, match="must be positive"):
        flash.parse_problem("S=0")  # a size still must be


def test_a_bool_argument_takes_true_or_false_and_refuses_anything_else(data_dir):
    """GQA forward's is_causal is a bool: 'on' or 2 was read as False, a silent non-causal tuning."""
    gqa = load_kernel(data_dir / "gqa_fwd.py")
    shape = "batch=1,heads=32,seq_len=1024,dim=128,groups=8"
    assert gqa.parse_problem(shape + ",is_causal=true")["is_causal"] is True
    assert gqa.parse_problem(shape + ",is_causal=0")["is_causal"] is False
    for typo in ("2", "on"):
        with pytest.raises(KernelFileError, match=f"is_causal='{typo}' is not a boolean"):
            gqa.parse_problem(f"{shape},is_causal={typo}")


def test_categorical_arguments_are_not_sizes_in_the_distance(flash, gemm_spec):
    a = flash.parse_problem("S=1024")
    assert flash.problem_distance(a, {**a, "S": 4096}) == pytest.approx(2.0)
    assert flash.problem_distance(a, {**a, "causal": 1}) is None  # a flag: another problem, not a nearby one
    assert flash.problem_distance(a, {**a, "D": 128}) is None  # a listed choice, though an int
    g = gemm_spec.parse_problem("M=4096,N=4096,K=4096")
    assert gemm_spec.problem_distance(g, {**g, "M": 8192, "K": 1024}) == pytest.approx(3.0)
    assert gemm_spec.problem_distance(g, {**g, "dtype": "bfloat16"}) is None
    assert gemm_spec.problem_distance(g, {"M": 4096}) is None


def test_a_size_whose_default_is_zero_may_be_given_as_zero(tmp_path):
    """A sliding window of 0 meaning none, left out of CHOICES: the default was taken, but
    ``window=0`` said "window must be positive" (a helper's port)."""
    path = tmp_path / "windowed.py"
    path.write_text(
        'PROBLEM = {"S": None, "window": 0}\nPARAMS = {"block": [64]}\n'
        "def kernel(problem, block): ...\ndef inputs(problem, device): ...\ndef reference(problem, args): ...\ndef flops(problem): return 1\n"
    )
    spec = load_kernel(path)
    assert spec.parse_problem("S=1024")["window"] == spec.parse_problem("S=1024,window=0")["window"] == 0
    assert spec.parse_problem("S=1024,window=128")["window"] == 128
    with pytest.raises(KernelFileError, match="window must be positive, got -1"):
        spec.parse_problem("S=1024,window=-1")
    with pytest.raises(KernelFileError, match="S must be positive"):
        spec.parse_problem("S=0")
