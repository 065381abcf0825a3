"""Store behaviour on SQLite and PostgreSQL: round trips, upserts, rankings, races."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timezone
from pathlib import Path
from typing import Any

import pytest

from ws_tuner.candidate import Lowering
from ws_tuner.result import Status, Timing, TrialResult
from ws_tuner.store import Store, StoredTrial, default_db_url, open_store
from ws_tuner.store import engine as store_engine


def test_commit_and_get_round_trip(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    cand = factories.candidate(1)
    result = TrialResult(
        cand.hash, Status.OK, message="fine", build_seconds=2.5,
        timing=Timing(0.5, 0.49, 0.52, 100), tflops=812.5, gbps=3987.25, info={"max_err": 1e-3, "clocks": [1980, 1755]},
    )
    stored = store.commit_trial(workload_id=wid, candidate=cand, result=result)
    fetched = store.get_trial(workload_id=wid, candidate_hash=cand.hash)

    assert isinstance(fetched, StoredTrial) and fetched == stored
    assert fetched.candidate == cand and fetched.candidate.hash == cand.hash
    assert fetched.candidate.schedule == factories.schedule(depth=3, consumer_nreg=224)
    assert fetched.result == result
    assert fetched.workload_id == wid and fetched.status is Status.OK
    assert fetched.created_at.tzinfo == timezone.utc and fetched.updated_at >= fetched.created_at
    assert store.get_trial(workload_id=wid, candidate_hash="0" * 20) is None
    assert store.get_trial(workload_id=wid + 1, candidate_hash=cand.hash) is None


def test_baseline_and_failure_round_trip(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    baseline = factories.candidate(2, Lowering.ROLE_BASED)
    failed = TrialResult(baseline.hash, Status.COMPILE_ERROR, message="ptxas: too many registers\nline 2")
    store.commit_trial(workload_id=wid, candidate=baseline, result=failed)

    got = store.trials_by_hash(workload_id=wid)[baseline.hash]
    assert got.candidate == baseline and got.candidate.schedule is None
    assert got.result == failed and got.result.timing is None


def test_built_is_overwritten_and_one_row_per_candidate(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    cand = factories.candidate(0)
    built = store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.BUILT, build_seconds=3.0))
    assert built.status is Status.BUILT and built.result.timing is None

    ok = store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.OK, 0.8))
    assert ok.status is Status.OK and ok.result.timing and ok.result.timing.median_ms == 0.8
    assert ok.created_at == built.created_at and ok.updated_at >= built.updated_at

    # A re-build (say, a resumed run) must not erase the runner's outcome...
    again = store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.BUILT))
    assert again.status is Status.OK and again.result.timing == ok.result.timing
    # ...but any other newer outcome wins.
    wrong = store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.WRONG, message="max err 3.2"))
    assert wrong.status is Status.WRONG and wrong.result.message == "max err 3.2" and wrong.result.timing is None

    assert store.status_counts(workload_id=wid) == {"wrong": 1}
    assert list(store.trials_by_hash(workload_id=wid)) == [cand.hash]

    # The same candidate on another workload is a separate trial (the candidate row is shared).
    other = store.workload_id(factories.key(m=4096))
    store.commit_trial(workload_id=other, candidate=cand, result=factories.result(cand, Status.OK, 0.3))
    assert store.status_counts(workload_id=other) == {"ok": 1}
    assert store.status_counts(workload_id=wid) == {"wrong": 1}


def test_top_k_best_and_counts(store: Store, factories: Any) -> None:
    key = factories.key()
    wid = store.workload_id(key)
    medians = [0.9, 0.4, 0.7, 0.4, 1.2]
    cands = [factories.candidate(i) for i in range(len(medians))]
    for cand, ms in zip(cands, medians):
        store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.OK, ms))
    for i, status in enumerate([Status.TIMEOUT, Status.REJECTED, Status.BUILT], start=len(medians)):
        cand = factories.candidate(i)
        store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, status, None))

    top = store.top_k(workload_id=wid, k=10)
    assert [t.result.timing.median_ms for t in top if t.result.timing] == [0.4, 0.4, 0.7, 0.9, 1.2]
    assert [t.candidate.hash for t in top[:2]] == [cands[1].hash, cands[3].hash]  # ties: first stored first
    assert [t.candidate.hash for t in store.top_k(workload_id=wid, k=2)] == [cands[1].hash, cands[3].hash]
    assert store.top_k(workload_id=wid, k=0) == []

    best = store.best(key=key)
    assert best is not None and best.candidate == cands[1]
    assert store.best(key=factories.key(m=1)) is None
    assert store.status_counts(workload_id=wid) == {"ok": 5, "timeout": 1, "rejected": 1, "built": 1}


def test_find_workloads(store: Store, factories: Any) -> None:
    a = store.workload_id(factories.key("gemm", 1024))
    b = store.workload_id(factories.key("gemm", 2048))
    c = store.workload_id(factories.key("attn", 1024, device="NVIDIA H100"))
    assert store.workload_id(factories.key("gemm", 1024)) == a  # get, not create

    assert [wid for wid, _ in store.find_workloads(kernel="gemm")] == [a, b]
    problem = {"M": 2048, "N": 8192, "K": 8192, "dtype": "float16"}
    assert store.find_workloads(kernel="gemm", problem=problem) == [(b, factories.key("gemm", 2048))]
    assert [wid for wid, _ in store.find_workloads(device="NVIDIA H100")] == [c]
    assert len(store.find_workloads(source_hash="ab" * 32)) == 3
    assert store.find_workloads(kernel="nope") == []


def test_workload_get_or_create_race(db_url: str, open_db: Callable[[str], Store], factories: Any) -> None:
    # Two stores are two engines, as in two worker processes.
    stores = [open_db(db_url), open_db(db_url)]
    for round_ in range(8):
        key = factories.key(m=round_ + 1)
        barrier = threading.Barrier(2)
        ids: list[int] = []

        def grab(store: Store) -> None:
            barrier.wait()
            ids.append(store.workload_id(key))

        threads = [threading.Thread(target=grab, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 2 and ids[0] == ids[1]
        assert [wid for wid, _ in stores[0].find_workloads(problem=key.problem)] == [ids[0]]


def test_workload_lost_race_is_resolved(
    db_url: str, open_db: Callable[[str], Store], factories: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deterministic version of the race: another process inserts between our
    # lookup and our insert, so our insert hits the unique constraint.
    winner, loser = open_db(db_url), open_db(db_url)
    key = factories.key()
    wid = winner.workload_id(key)
    real = Store._lookup_workload
    calls = iter([None])
    monkeypatch.setattr(loser, "_lookup_workload", lambda h: next(calls, real(loser, h)))
    assert loser.workload_id(key) == wid
    assert len(loser.find_workloads()) == 1


def test_concurrent_commits_leave_one_row_each(db_url: str, open_db: Callable[[str], Store], factories: Any) -> None:
    stores = [open_db(db_url), open_db(db_url)]
    wid = stores[0].workload_id(factories.key())
    cands = [factories.candidate(i) for i in range(12)]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        store = stores[n % 2]
        try:
            for i, cand in enumerate(cands):  # every thread commits every candidate
                status = Status.BUILT if (i + n) % 3 == 0 else Status.OK
                store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, status, 1.0 + n))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    trials = stores[0].trials_by_hash(workload_id=wid)
    assert set(trials) == {c.hash for c in cands}
    assert sum(stores[0].status_counts(workload_id=wid).values()) == len(cands)
    # Every candidate got at least one OK commit, and BUILT never overwrites OK.
    assert all(t.status is Status.OK for t in trials.values())


def test_commit_rejects_a_result_for_another_candidate(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    a, b = factories.candidate(0), factories.candidate(1)
    with pytest.raises(ValueError, match="not"):
        store.commit_trial(workload_id=wid, candidate=a, result=factories.result(b))


def test_open_store_resolves_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(store_engine.ENV_VAR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_url() == f"sqlite:///{tmp_path}/home/.cache/ws-tune/ws-tune.db"
    with open_store() as store:  # default: the directory is created
        assert store.url == default_db_url()
    assert (tmp_path / "home/.cache/ws-tune/ws-tune.db").is_file()

    monkeypatch.setenv(store_engine.ENV_VAR, str(tmp_path / "env.db"))
    with open_store() as store:
        assert store.url == f"sqlite:///{tmp_path}/env.db"

    monkeypatch.chdir(tmp_path)
    with open_store("relative.db") as store:  # a bare path wins over the env var
        assert store.url == f"sqlite:///{tmp_path}/relative.db"
    with open_store(f"sqlite:///{tmp_path}/url.db") as store:
        assert store.url == f"sqlite:///{tmp_path}/url.db"


def test_commit_trials_in_one_batch_keeps_the_upsert_rules(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    kept, rebuilt, twice = factories.candidate(0), factories.candidate(1), factories.candidate(2)
    store.commit_trial(workload_id=wid, candidate=rebuilt, result=factories.result(rebuilt, Status.OK, 0.7))
    store.commit_trials(workload_id=wid, items=[])  # nothing to write is no error
    store.commit_trials(
        workload_id=wid,
        items=[
            (twice, factories.result(twice, Status.OK, 0.9)),
            (kept, factories.result(kept, Status.OK, 0.5, ratio=0.8, confirmed=True)),
            (rebuilt, factories.result(rebuilt, Status.BUILT, None)),  # never replaces a final outcome
            (twice, factories.result(twice, Status.WRONG, None, message="max err 2")),  # the later result wins
        ],
    )
    stored = store.trials_by_hash(workload_id=wid)
    assert set(stored) == {kept.hash, rebuilt.hash, twice.hash}
    assert stored[kept.hash].result == factories.result(kept, Status.OK, 0.5, ratio=0.8, confirmed=True)
    assert stored[kept.hash].candidate == kept
    assert stored[rebuilt.hash].status is Status.OK and stored[rebuilt.hash].result.timing.median_ms == 0.7
    assert stored[twice.hash].status is Status.WRONG and stored[twice.hash].result.message == "max err 2"
    assert [t.candidate.hash for t in store.top_k(workload_id=wid)] == [kept.hash, rebuilt.hash]


def test_commit_trials_refuses_a_result_for_another_candidate(store: Store, factories: Any) -> None:
    wid = store.workload_id(factories.key())
    a, b = factories.candidate(0), factories.candidate(1)
    with pytest.raises(ValueError, match="not"):
        store.commit_trials(workload_id=wid, items=[(a, factories.result(a)), (a, factories.result(b))])
    assert store.trials_by_hash(workload_id=wid) == {}  # nothing of the batch was written
