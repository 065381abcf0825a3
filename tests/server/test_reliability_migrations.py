"""Reliability scenario 12: ``ws-tune db upgrade`` from every released schema, on
SQLite and PostgreSQL, keeps every row, ends exactly at the models, and leaves
Optuna's tables (which share the database) untouched.

Released schemas: v0.1.0.a, the tuning engine before the service. On SQLite it
comes from a frozen asset (``data/v0.1.0.a.sqlite.sql``: a database written by
0.1.0's migration, with a trial and an Optuna study, dumped as SQL), so that an
edit to an old migration cannot hide an upgrade bug; on PostgreSQL from the
frozen migration itself, with the same rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from ws_tuner.store import SchemaOutdatedError, Store, current_revision, head_revision, upgrade
from ws_tuner.store import engine as store_engine, schema
from ws_tuner.store.models import Base

DATA = Path(__file__).resolve().parent / "data"
RELEASED = ["v0.1.0.a", "v0.2.0.a"]
UNRELEASED = ["v0.3.0.a", "v0.3.0.b"]  # steps of the coming release, before its head: no database in the field has them
OPTUNA_TABLES = {"studies", "trials", "trial_params", "trial_values", "study_directions", "alembic_version"}


def seed_v0_1_0(url: str) -> None:
    """The rows of the frozen asset, written with the 0.1.0 schema."""
    engine = create_engine(url)
    problem = '{"K":4096,"M":4096,"N":4096,"b_layout":"row","dtype":"float16"}'
    with engine.begin() as c:
        c.execute(text(
            "INSERT INTO ws_tune_workloads (id, key_hash, kernel, source_hash, problem, arch, device, tilelang_version, "
            "cuda_version, driver_version) VALUES (1, 'k1', 'gemm', :sh, :problem, 'sm_90a', 'NVIDIA H200', '0.1.15', '12.8', '570.1')"
        ), {"sh": "ab" * 32, "problem": problem})  # fmt: skip
        c.execute(text("INSERT INTO ws_tune_candidates (id, hash, lowering, params, schedule) "
                       "VALUES (1, 'c0ffee0000000000cafe', 'default', :params, NULL)"), {"params": '{"block_M":128}'})  # fmt: skip
        c.execute(text(
            "INSERT INTO ws_tune_trials (id, workload_id, candidate_id, status, message, build_seconds, median_ms, p20_ms, "
            "p80_ms, reps, tflops, info) VALUES (1, 1, 1, 'ok', '', 1.5, 0.5, 0.49, 0.51, 30, 275.0, :info)"
        ), {"info": '{"role":"search"}'})  # fmt: skip
    engine.dispose()


def optuna_study(url: str, name: str = "frozen", n_trials: int = 3) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(storage=storage, study_name=name, sampler=optuna.samplers.RandomSampler(seed=0), load_if_exists=True)
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n_trials)
        return len(study.trials)
    finally:
        storage.remove_session()
        storage.engine.dispose()


def snapshot(url: str, tables: set[str]) -> dict[str, list[Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            present = set(inspect(c).get_table_names())
            return {t: sorted(map(tuple, c.execute(text(f"SELECT * FROM {t}")).fetchall()), key=repr) for t in sorted(tables & present)}
    finally:
        engine.dispose()


def released_database(db_url: str, revision: str) -> None:
    if db_url.startswith("sqlite"):
        connection = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        connection.executescript((DATA / f"{revision}.sqlite.sql").read_text())
        connection.close()
        return
    engine = store_engine.make_engine(db_url)
    schema.migrate(engine, revision)
    engine.dispose()
    seed_v0_1_0(db_url)
    optuna_study(db_url)


def test_every_released_schema_is_known() -> None:
    revisions = [s.revision for s in ScriptDirectory.from_config(schema.alembic_config()).walk_revisions()]
    assert head_revision() == "v0.3.0.c" and set(RELEASED) | set(UNRELEASED) | {head_revision()} == set(revisions)
    assert all((DATA / f"{r}.sqlite.sql").is_file() for r in RELEASED)


@pytest.mark.parametrize("revision", RELEASED)
def test_upgrade_from_released_schema(revision: str, db_url: str, open_db: Callable[[str], Store]) -> None:
    released_database(db_url, revision)
    assert current_revision(db_url) == revision
    optuna_before = snapshot(db_url, OPTUNA_TABLES)
    assert optuna_before["studies"] and optuna_before["trials"]
    with pytest.raises(SchemaOutdatedError, match="ws-tune db upgrade"):
        Store(db_url)  # an old schema is refused, not used or migrated behind the user's back

    assert upgrade(db_url) == head_revision()  # what `ws-tune db upgrade` runs
    assert upgrade(db_url) == head_revision()  # and again: a no-op

    store = open_db(db_url)
    trials = store.trials_by_hash(workload_id=1)
    assert list(trials) == ["c0ffee0000000000cafe"] and trials["c0ffee0000000000cafe"].result.timing.median_ms == 0.5
    assert snapshot(db_url, OPTUNA_TABLES) == optuna_before  # Optuna's tables, rows and version untouched
    assert optuna_study(db_url, n_trials=1) == 4  # and Optuna still works there
    optuna_after = snapshot(db_url, OPTUNA_TABLES)

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={
                "compare_type": True, "include_name": lambda name, type_, _: type_ != "table" or name in Base.metadata.tables})  # fmt: skip
            assert compare_metadata(context, Base.metadata) == []  # upgraded == created fresh
    finally:
        engine.dispose()

    # The service works on the upgraded database, and the new revision downgrades cleanly.
    from ws_tuner.store.queue import JobQueue
    from ws_tuner.store.registry import Registry

    kernel = Registry(store).put_kernel("gemm", "PROBLEM = {}\n")
    JobQueue(store).create_job(kernel_id=kernel.id, kernel="gemm", problem={}, problem_checked=False, params=None,
                               strategy="grid", seed=0, budget=1)  # fmt: skip
    store.close()
    command.downgrade(schema.alembic_config(db_url), revision)
    assert current_revision(db_url) == revision and snapshot(db_url, OPTUNA_TABLES) == optuna_after
    assert ("ws_tune_jobs" in snapshot(db_url, {"ws_tune_jobs"})) == (revision >= "v0.2.0.a")
    assert snapshot(db_url, {"ws_tune_trials"})["ws_tune_trials"]
    assert upgrade(db_url) == head_revision()


def test_gbps_revision_keeps_rows_and_the_rank_index_both_ways(db_url: str, open_db: Callable[[str], Store]) -> None:
    """v0.3.0.c adds ``gbps`` (NULL on the rows before it) and drops it again; on SQLite
    the drop copies the table, and the rank index (an expression index, which
    SQLAlchemy cannot reflect to copy) must be there afterwards all the same."""
    engine = store_engine.make_engine(db_url)
    schema.migrate(engine, "v0.1.0.a")
    engine.dispose()
    seed_v0_1_0(db_url)
    assert upgrade(db_url) == "v0.3.0.c"
    stored = open_db(db_url).trials_by_hash(workload_id=1)["c0ffee0000000000cafe"].result
    assert stored.tflops == 275.0 and stored.gbps is None
    command.downgrade(schema.alembic_config(db_url), "v0.3.0.b")
    engine = create_engine(db_url)
    try:
        for table in ("ws_tune_trials", "ws_tune_job_trials"):
            assert "gbps" not in {c["name"] for c in inspect(engine).get_columns(table)}
        indexes = "sqlite_master WHERE name" if db_url.startswith("sqlite") else "pg_indexes WHERE schemaname = current_schema() AND indexname"
        with engine.connect() as c:
            rank = c.execute(text(f"SELECT 1 FROM {indexes} = 'ix_ws_tune_trials_workload_rank'")).all()
    finally:
        engine.dispose()
    assert rank and snapshot(db_url, {"ws_tune_trials"})["ws_tune_trials"]
    assert upgrade(db_url) == head_revision()
