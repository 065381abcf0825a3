"""Schedules and candidates: JSON and hash stability, the T.WSSchedule round trip,
and TileLang source a user can paste back into the kernel."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ws_tuner import compiler
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.schedule import Schedule


@pytest.fixture(scope="module")
def variants(gemm_task):
    """A handful of surviving candidates from different corners of the space."""
    out = []
    for i, cand in enumerate(gemm_task.space().candidates()):
        if i % 997 == 0:
            out.append(cand)
        if len(out) == 12:
            break
    return out


def test_json_round_trip_and_canonical_form(variants):
    for cand in variants:
        text = cand.canonical()
        assert " " not in text and json.loads(text) == cand.to_json()
        again = Candidate.from_json(json.loads(text))
        assert again == cand and again.hash == cand.hash


def test_hash_is_stable_across_processes(variants):
    cand = variants[3]
    code = (
        "import json,sys; from ws_tuner.candidate import Candidate;"
        "print(Candidate.from_json(json.loads(sys.stdin.read())).hash)"
    )
    other = subprocess.run([sys.executable, "-c", code], input=cand.canonical(), capture_output=True, text=True, check=True)
    assert other.stdout.strip() == cand.hash
    # PYTHONHASHSEED must not matter: the hash is sha256 of canonical JSON.
    other = subprocess.run([sys.executable, "-c", code], input=cand.canonical(), capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert other.stdout.strip() == cand.hash


def test_different_candidates_hash_differently(variants):
    assert len({c.hash for c in variants}) == len(variants)


def test_async_copies_round_trip_and_leave_other_hashes_alone(variants):
    """Loops issued by cp.async are part of a schedule's JSON and hash, and absent from
    the JSON of one that has none: hashes stored before the field existed still match."""
    cand = variants[0]
    assert "async_copies" not in cand.to_json()["schedule"]
    by_cp_async = Candidate.make(cand.param_dict, cand.schedule.with_(async_copies=("parallel_1",)))
    again = Candidate.from_json(json.loads(by_cp_async.canonical()))
    assert again == by_cp_async and again.schedule.async_copies == ("parallel_1",) and again.hash != cand.hash
    source = by_cp_async.schedule.to_source()
    assert source.splitlines()[0] == "# and write loop 'parallel_1' as T.Parallel(..., prefer_async=True): its copies by cp.async"


def test_malformed_schedule_json_is_a_value_error():
    with pytest.raises(ValueError, match="malformed schedule JSON"):
        Schedule.from_json({"num_warps": 12, "roles": [["a", 0]]})
    with pytest.raises(ValueError, match="unknown sync kind"):
        Schedule.from_json({"num_warps": 4, "roles": [], "pipelines": [], "scopes": [["s", [["r", [["NOPE", "p", 0]]]]]]})


def test_round_trip_through_tilelang_objects(gemm_task, variants):
    for cand in variants:
        func = gemm_task.primfunc(cand.param_dict)
        prepared, _ = compiler.prepare(func)
        attached = compiler.attach(prepared, cand.schedule)
        assert compiler.own_schedule(attached) == cand.schedule


def test_a_baseline_takes_no_schedule():
    with pytest.raises(ValueError):
        Candidate.make({"a": 1}, None, Lowering.WS)
    assert Candidate.make({"a": 1}, None, Lowering.DEFAULT).schedule is None


def test_rendered_source_pastes_into_the_kernel(tmp_path, variants, data_dir):
    """Paste a candidate's rendered T.annotate_ws_schedule(...) into a kernel:
    the kernel then carries exactly that schedule, and it verifies."""
    flat = [c for c in variants if not c.param_dict["persistent"]]
    assert flat
    template = (data_dir / "paste_template.py").read_text()
    for i, cand in enumerate(flat[:4]):
        path = tmp_path / f"pasted_{i}.py"
        path.write_text(template.replace("            # PASTE HERE", cand.schedule.to_source(indent="            ")))
        spec = load_kernel(path)
        func = spec.build(spec.parse_problem("M=4096,N=4096,K=4096"), cand.param_dict)
        assert compiler.own_schedule(func) == cand.schedule
        compiler.verify(func)
