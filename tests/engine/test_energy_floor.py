"""benchmarks/energy_floor.py on the CPU: its floors are the kernels they claim to be
(built for sm_90a by tilelang), and its ablations of examples/attention.py still
find the text they remove (they would silently measure the unablated winner if the
kernel changed under them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ws_tuner.kernel import load_kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def floor():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports harness.py beside it, as the benchmark scripts do
    spec = importlib.util.spec_from_file_location("energy_floor", ROOT / "benchmarks" / "energy_floor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["energy_floor"] = module
    spec.loader.exec_module(module)
    return module


def _source(floor, func) -> str:
    return floor.compile_floor(func).get_kernel_source()


def test_the_gemm_floors_load_what_they_claim(floor):
    """"l2": the pipelined main loop, TMA loads synchronized by mbarriers; "noload":
    the operands read once, the K loop's wgmma on them with nothing to wait for."""
    l2 = _source(floor, floor.gemm_floor(512, 512, 512, mode="l2"))
    noload = _source(floor, floor.gemm_floor(512, 512, 512, mode="noload"))
    assert "tma_load" in l2 and ".wait(" in l2
    assert "tma_load" not in noload and ".wait(" not in noload
    assert "wgmma" in l2 and "wgmma" in noload


def test_the_attention_floors_have_no_softmax(floor):
    loads = _source(floor, floor.attention_floor(1, 1, 256, 64, mode="loads"))
    noload = _source(floor, floor.attention_floor(1, 1, 256, 64, mode="noload"))
    for src in (loads, noload):
        assert "wgmma" in src and "exp2" not in src and "max(" not in src
    assert "tma_load" in loads and "tma_load" not in noload


@pytest.mark.parametrize("name", ["ws_no_rescale", "ws_no_exp"])
def test_each_ablation_removes_its_text_from_the_attention_kernel(floor, name, tmp_path):
    original = ROOT / "examples" / "attention.py"
    copy = floor.ablated(original, name, tmp_path)
    old, new = floor.ABLATIONS[name]
    before, after = original.read_text(), copy.read_text()
    assert before.count(old) == 1 and old not in after
    assert after == before.replace(old, new)
    load_kernel(copy)  # still a kernel file


def test_an_ablation_whose_text_is_gone_is_refused(floor, tmp_path):
    changed = tmp_path / "attention.py"
    changed.write_text((ROOT / "examples" / "attention.py").read_text().replace(floor.ABLATIONS["ws_no_exp"][0], ""))
    with pytest.raises(SystemExit, match="occurs 0 times"):
        floor.ablated(changed, "ws_no_exp", tmp_path)
