"""The best-schedule lookup (``Store.best_stored``, and the same on the raw driver:
``best_stored_fast``): the exact rank order across toolchains, the reference lowering never the answer, and a plan that reads the
rank index in order (no sort: the cost does not grow with the workload)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest

from sqlalchemy import text

from ws_tuner.candidate import Lowering, canonical_json
from ws_tuner.result import Status
from ws_tuner.store import Store
from ws_tuner.store.repository import _BEST_AT


_LOOP = asyncio.new_event_loop()  # best_stored_async's connections serve one loop: the same for every test


@pytest.fixture(scope="module", autouse=True)
def _close_loop() -> Iterator[None]:
    yield
    _LOOP.close()


def _lookup(store: Store, key: Any) -> Any:
    """``best_stored``'s answer, checked against the server's raw-driver paths
    (``best_stored_fast``, and ``best_stored_async`` on an event loop)."""
    where = {"kernel": key.kernel, "source_hash": key.source_hash, "problem": key.problem, "device": key.device}
    found = store.best_stored(**where)
    assert store.best_stored_fast(**where) == found
    assert _LOOP.run_until_complete(store.best_stored_async(**where)) == found
    return found


def test_best_follows_the_rank_order(store: Store, factories: Any) -> None:
    key = factories.key()
    wid = store.workload_id(key)
    cands = [factories.candidate(i) for i in range(6)]

    def commit(i: int, ms: float | None, ratio: float | None = None, confirmed: bool = False, status: Status = Status.OK) -> None:
        result = factories.result(cands[i], status, ms, ratio=ratio, confirmed=confirmed)
        store.commit_trial(workload_id=wid, candidate=cands[i], result=result)

    commit(0, 0.1)  # fastest, but without a ratio: after every ratio
    commit(1, 0.6, ratio=0.8)
    commit(2, 0.5, ratio=0.8)  # equal ratio: the faster
    commit(3, 0.5, ratio=0.8)  # equal ratio and time: the first stored
    commit(4, None, status=Status.TIMEOUT)
    reference = factories.candidate(9, Lowering.REFERENCE)
    store.commit_trial(workload_id=wid, candidate=reference, result=factories.result(reference, Status.OK, 0.01, ratio=0.1, confirmed=True))

    best = _lookup(store, key)
    assert best is not None and best.candidate_hash == cands[2].hash and best.key == key
    assert best.params_json == canonical_json(cands[2].param_dict)
    assert best.schedule_json == canonical_json(cands[2].schedule.to_json()) and best.lowering == "ws"
    assert (best.median_ms, best.reps) == (0.5, 50)

    commit(5, 2.0, ratio=1.5, confirmed=True)  # confirmed in the final tournament: first of all
    assert _lookup(store, key).candidate_hash == cands[5].hash

    # Another toolchain's workload of the same (kernel, source, problem, device) competes by the same order.
    other = dataclasses.replace(key, tilelang_version="0.1.16")
    other_id = store.workload_id(other)
    newer = factories.candidate(7)
    store.commit_trial(workload_id=other_id, candidate=newer, result=factories.result(newer, Status.OK, 3.0, ratio=1.2, confirmed=True))
    found = _lookup(store, key)
    assert found.candidate_hash == newer.hash and found.key == other
    assert _lookup(store, dataclasses.replace(key, device="NVIDIA B200")) is None


def test_only_the_reference_is_no_answer(store: Store, factories: Any) -> None:
    key = factories.key()
    wid = store.workload_id(key)
    reference = factories.candidate(0, Lowering.REFERENCE)
    store.commit_trial(workload_id=wid, candidate=reference, result=factories.result(reference, Status.OK, 0.5))
    assert _lookup(store, key) is None
    baseline = factories.candidate(1, Lowering.DEFAULT)
    store.commit_trial(workload_id=wid, candidate=baseline, result=factories.result(baseline, Status.OK, 0.9))
    found = _lookup(store, key)
    assert found.candidate_hash == baseline.hash and found.schedule_json is None


def test_best_reads_the_rank_index_in_order(store: Store) -> None:
    """The plan has no sort: the index gives RANK_ORDER column for column. On
    PostgreSQL sorting is made prohibitively dear, so a sort in the plan means
    the index cannot give the order (whatever the table's size)."""
    with store.engine.connect() as connection:
        where = _BEST_AT.params(kernel="gemm", source_hash="ab", problem="{}", device="NVIDIA H200")
        statement = str(where.compile(connection, compile_kwargs={"literal_binds": True}))
        if store.dialect == "sqlite":
            plan = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")]
        else:
            connection.execute(text("SET LOCAL enable_sort = off"))
            connection.execute(text("SET LOCAL enable_seqscan = off"))
            plan = [row[0] for row in connection.exec_driver_sql(f"EXPLAIN {statement}")]
    assert any("ix_ws_tune_trials_workload_rank" in line for line in plan), plan
    assert not any("Sort" in line or "TEMP B-TREE" in line for line in plan), plan


def test_the_fast_path_gives_the_stored_answer(store: Store, factories: Any) -> None:
    """``best_stored_fast`` reads what ``best_stored`` reads, value for value and type for
    type (SQLite's text times and 0/1 booleans converted as SQLAlchemy converts them), on
    every kind of row: no ratio, no tflops or gbps, no schedule, a re-measured row, another toolchain."""
    key = factories.key()
    wid = store.workload_id(key)
    ws, baseline = factories.candidate(1), factories.candidate(2, Lowering.DEFAULT)
    store.commit_trial(workload_id=wid, candidate=baseline, result=factories.result(baseline, Status.OK, 0.4))
    before = _lookup(store, key)
    assert before.candidate_hash == baseline.hash and before.schedule_json is None and before.tflops is None and before.gbps is None

    timed = factories.result(ws, Status.OK, 0.5, ratio=0.9, confirmed=True, tflops=321.5, gbps=2048.5)
    store.commit_trial(workload_id=wid, candidate=ws, result=timed)
    fast = store.best_stored_fast(kernel=key.kernel, source_hash=key.source_hash, problem=key.problem, device=key.device)
    assert fast == _lookup(store, key) and fast.candidate_hash == ws.hash and (fast.tflops, fast.gbps) == (321.5, 2048.5)
    assert fast.updated_at.tzinfo is not None and fast.updated_at >= before.updated_at
    assert (type(fast.median_ms), type(fast.reps), type(fast.trial_id)) == (float, int, int)

    # Re-measured: a new time and version, read afresh by both paths.
    store.commit_trial(workload_id=wid, candidate=ws, result=factories.result(ws, Status.OK, 0.45, ratio=0.9, confirmed=True))
    again = _lookup(store, key)
    assert again.median_ms == 0.45 and again.updated_at >= fast.updated_at

    other = dataclasses.replace(key, cuda_version="13.0")
    faster = factories.candidate(3)
    store.commit_trial(workload_id=store.workload_id(other), candidate=faster, result=factories.result(faster, Status.OK, 0.1, ratio=0.5, confirmed=True))
    assert _lookup(store, key).key == other
    assert _lookup(store, dataclasses.replace(key, problem='{"M": 1}')) is None


@pytest.mark.parametrize("which", ["_best_query", "_best_of_workload", "_best_many"])
def test_the_fast_path_keeps_a_generic_plan_on_the_rank_index(store: Store, which: str) -> None:
    """On PostgreSQL the raw path's prepared statements keep one generic plan
    (bestread.py): that plan, made without the key's values, must still read the rank
    index in order. Sorting is made prohibitively dear, as in the test above."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite plans each statement as it is prepared")
    query = getattr(store, which)
    assert query is not None
    key = {"kernel": "gemm", "source_hash": "ab", "problem": "{}", "device": "NVIDIA H200"}
    values: dict[str, Any] = {
        "_best_query": key, "_best_of_workload": {"workload_id": 1},
        "_best_many": {f"{name}_list": [value, value] for name, value in key.items()},  # two keys at once
    }[which]  # fmt: skip
    names = list(query.params(values))
    statement = query.sql
    for i, name in enumerate(names, 1):
        statement = statement.replace(f"%({name})s", f"${i}")
    with store.engine.connect() as connection:
        for setting in ("plan_cache_mode = force_generic_plan", "enable_sort = off", "enable_seqscan = off"):
            connection.execute(text(f"SET LOCAL {setting}"))
        connection.exec_driver_sql(f"PREPARE ws_tune_best AS {statement}")  # parameter types inferred
        arguments = ", ".join({int: "1", list: "'{x,y}'"}.get(type(values[name]), "'x'") for name in names)
        plan = [row[0] for row in connection.exec_driver_sql(f"EXPLAIN EXECUTE ws_tune_best({arguments})")]
        connection.exec_driver_sql("DEALLOCATE ws_tune_best")
    assert any("ix_ws_tune_trials_workload_rank" in line for line in plan), plan
    assert not any("Sort" in line for line in plan), plan
    # The statement's constants are written in, not parameters ($n) the generic plan cannot see.
    assert not any(re.search(r"\((status|lowering)\)\S* (=|<>) \(?\$\d", line) for line in plan), plan


def test_lookups_that_arrive_together_are_answered_by_one_statement(store: Store, factories: Any) -> None:
    """On PostgreSQL the server's concurrent lookups go out together (bestread.Coalesced):
    each gets the answer it would get alone (hits, misses, the same key twice), and
    while one statement is out the others wait to go in the next."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite lookups are read in place, one at a time")
    keys = [dataclasses.replace(factories.key(), problem=canonical_json({"M": 64 * i})) for i in range(3)]
    for i, key in enumerate(keys[:2]):
        wid = store.workload_id(key)
        for j in range(3):
            cand = factories.candidate(10 * i + j)
            store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand, Status.OK, 0.5 + j, ratio=1.0 + j))
    asked = [keys[0], keys[1], keys[2], keys[0], dataclasses.replace(keys[1], device="NVIDIA B200")] * 8
    wheres = [{"kernel": k.kernel, "source_hash": k.source_hash, "problem": k.problem, "device": k.device} for k in asked]
    statements: list[int] = []
    many = store._best_many
    assert many is not None
    run = many.all_on_loop

    async def counted(values: dict[str, Any]) -> Any:
        statements.append(len(values["kernel_list"]))
        return await run(values)

    many.all_on_loop = counted  # type: ignore[method-assign]

    async def together() -> list[Any]:
        return await asyncio.gather(*(store.best_stored_async(**where) for where in wheres))

    try:
        answers = _LOOP.run_until_complete(together())
    finally:
        del many.all_on_loop
    assert answers == [store.best_stored(**where) for where in wheres]
    assert answers[0] is not None and answers[2] is None and answers[4] is None
    assert sum(statements) == len(wheres) and len(statements) < len(wheres), statements


def test_the_in_process_lookup_reads_what_top_k_reads(store: Store, factories: Any) -> None:
    """``best_compilable`` (``lookup.best_trial``'s raw-driver path) is ``top_k``'s first
    compilable trial, candidate, result and times alike; a faster vendor reference is skipped."""
    key = factories.key()
    wid = store.workload_id(key)
    assert store.best_compilable(workload_id=wid) is None
    slow, fast = factories.candidate(1), factories.candidate(2, Lowering.DEFAULT)
    reference = factories.candidate(3, Lowering.REFERENCE)
    store.commit_trial(workload_id=wid, candidate=slow, result=factories.result(slow, Status.OK, 0.6, ratio=1.2, confirmed=True, tflops=10.0))
    store.commit_trial(workload_id=wid, candidate=fast, result=factories.result(fast, Status.OK, 0.5, ratio=1.0, confirmed=True))
    store.commit_trial(workload_id=wid, candidate=reference, result=factories.result(reference, Status.OK, 0.1, ratio=0.2, confirmed=True))
    found = store.best_compilable(workload_id=wid)
    (first,) = [t for t in store.top_k(workload_id=wid, k=3) if t.candidate.lowering is not Lowering.REFERENCE][:1]
    assert found == first and found.candidate.hash == fast.hash and found.result.timing.median_ms == 0.5
    assert found.updated_at.tzinfo is not None and isinstance(found.result.info, dict)


def test_a_locked_sqlite_file_holds_a_lookup_on_the_loop_briefly(tmp_path: Any, factories: Any) -> None:
    """The server reads SQLite on its event loop (bestread.py): a lookup that finds the
    file locked waits SQLITE_LOOP_BUSY_MS, not the engine's busy timeout of seconds,
    then fails as a store error (a 503 to retry)."""
    import sqlite3
    import time

    from ws_tuner.store import StoreError
    from ws_tuner.store.bestread import SQLITE_LOOP_BUSY_MS

    path = tmp_path / "locked.db"
    store = Store(f"sqlite:///{path}")
    try:
        key = factories.key()
        cand = factories.candidate(1)
        store.commit_trial(workload_id=store.workload_id(key), candidate=cand, result=factories.result(cand, Status.OK, 0.5))
        where = {"kernel": key.kernel, "source_hash": key.source_hash, "problem": key.problem, "device": key.device}
        assert store.best_stored_fast(**where).candidate_hash == cand.hash
        # An exclusive lock in WAL mode needs the file to itself: the store's connections go first.
        store.engine.dispose()
        store._best_query.close()
        store._best_query._closed = False
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")  # once it has written, no one else may read
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("UPDATE ws_tune_trials SET reps = reps")
        holder.execute("COMMIT")
        try:
            start = time.monotonic()
            with pytest.raises(StoreError):
                _LOOP.run_until_complete(store.best_stored_async(**where))
            assert time.monotonic() - start < SQLITE_LOOP_BUSY_MS / 1000 + 1.0
        finally:
            holder.close()
        assert store.best_stored_fast(**where).candidate_hash == cand.hash  # the lock gone, lookups answer again
    finally:
        store.close()
