"""Schema handling: auto-create, outdated/unknown revisions, upgrades, open
failures, and coexistence with Optuna's tables in the same database."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from ws_tuner.store import SchemaOutdatedError, Store, StoreError, current_revision, head_revision, upgrade
from ws_tuner.store import schema
from ws_tuner.store.models import VERSION_TABLE, Base

WS_TABLES = {"ws_tune_workloads", "ws_tune_candidates", "ws_tune_trials", VERSION_TABLE,
             # v0.2.0.a: the service
             "ws_tune_kernels", "ws_tune_tokens", "ws_tune_jobs", "ws_tune_job_trials", "ws_tune_workers"}
HEAD = "v0.3.0.c"

NEXT_REVISION = '''
import sqlalchemy as sa
from alembic import op

revision = "v9.0.0.test"
down_revision = "v0.3.0.c"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ws_tune_trials") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ws_tune_trials") as batch:
        batch.drop_column("note")
'''


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _execute(url: str, *statements: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            return [connection.execute(text(s)).fetchall() if s.lstrip().upper().startswith("SELECT") else connection.execute(text(s)) for s in statements]
    finally:
        engine.dispose()


def test_fresh_database_is_migrated_on_open(db_url: str, open_db: Callable[[str], Store]) -> None:
    assert current_revision(db_url) is None and _tables(db_url) == set()
    open_db(db_url)
    assert current_revision(db_url) == head_revision() == HEAD
    assert _tables(db_url) == WS_TABLES
    open_db(db_url)  # reopening at head is a no-op
    assert upgrade(db_url) == head_revision()


def test_models_match_migrations(db_url: str, open_db: Callable[[str], Store]) -> None:
    # Whoever adds a model (jobs, tokens, ...) must add a migration too.
    open_db(db_url)
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"compare_type": True, "include_name": lambda name, type_, _: type_ != "table" or name in Base.metadata.tables},
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_outdated_schema_is_refused_until_upgraded(
    db_url: str, open_db: Callable[[str], Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factories: Any
) -> None:
    store = open_db(db_url)  # at HEAD
    wid = store.workload_id(factories.key())
    cand = factories.candidate(0)
    store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand))

    # A newer ws-tune: the shipped migrations plus one more revision.
    migrations = tmp_path / "migrations"
    shutil.copytree(schema.MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "v0_2_0_test.py").write_text(NEXT_REVISION)
    monkeypatch.setattr(schema, "MIGRATIONS_DIR", migrations)
    assert head_revision() == "v9.0.0.test"

    with pytest.raises(SchemaOutdatedError) as info:
        Store(db_url)
    message = str(info.value)
    assert "\n" not in message and HEAD in message and "v9.0.0.test" in message
    assert "ws-tune db upgrade --db" in message and info.value.current == HEAD

    assert Store.upgrade(db_url) == "v9.0.0.test"
    upgraded = open_db(db_url)
    assert upgraded.get_trial(workload_id=wid, candidate_hash=cand.hash) is not None  # data survived
    engine = create_engine(db_url)
    try:
        assert "note" in {c["name"] for c in inspect(engine).get_columns("ws_tune_trials")}
    finally:
        engine.dispose()


def test_unknown_revision_is_refused(db_url: str, open_db: Callable[[str], Store]) -> None:
    open_db(db_url)
    _execute(db_url, f"UPDATE {VERSION_TABLE} SET version_num = 'v9.9.9.z'")
    with pytest.raises(StoreError) as info:
        Store(db_url)
    assert not isinstance(info.value, SchemaOutdatedError)
    assert "v9.9.9.z" in str(info.value) and "newer ws-tune" in str(info.value)


def test_tables_without_a_stamp_are_refused(db_url: str, open_db: Callable[[str], Store]) -> None:
    open_db(db_url)
    _execute(db_url, f"DELETE FROM {VERSION_TABLE}")
    with pytest.raises(StoreError, match="no revision"):
        Store(db_url)


def test_downgrade_touches_only_ws_tune_tables(db_url: str, open_db: Callable[[str], Store]) -> None:
    _execute(db_url, "CREATE TABLE other_tool (id INTEGER PRIMARY KEY)", "INSERT INTO other_tool VALUES (7)")
    open_db(db_url).close()
    command.downgrade(schema.alembic_config(db_url), "base")
    assert _tables(db_url) == {"other_tool", VERSION_TABLE}
    assert _execute(db_url, "SELECT id FROM other_tool")[0] == [(7,)]
    open_db(db_url)  # empty version table and no ws-tune tables: fresh again
    assert _tables(db_url) == WS_TABLES | {"other_tool"}


@pytest.mark.postgres
def test_unreachable_postgres_gives_one_line_error() -> None:
    url = "postgresql+psycopg://ws:secret@127.0.0.1:1/nowhere"
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        Store(url)
    message = str(info.value)
    assert time.monotonic() - started < 5
    assert "\n" not in message and "secret" not in message
    assert "postgresql+psycopg://ws:***@127.0.0.1:1/nowhere" in message and "refused" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no SQLAlchemy traceback


@pytest.mark.parametrize("where", ["missing_dir", "file_as_dir", "proc", "proc_subdir"])
def test_unwritable_sqlite_path_gives_one_line_error(where: str, tmp_path: Path) -> None:
    # Tests run as root, for whom chmod 555 means nothing; these fail for root too.
    (tmp_path / "plain_file").write_text("")
    path = {
        "missing_dir": tmp_path / "missing" / "ws.db",
        "file_as_dir": tmp_path / "plain_file" / "ws.db",
        "proc": Path("/proc/ws-tune-test.db"),
        "proc_subdir": Path("/proc/ws-tune-test/ws.db"),
    }[where]
    with pytest.raises(StoreError) as info:
        Store(f"sqlite:///{path}")
    message = str(info.value)
    assert "\n" not in message and f"sqlite:///{path}" in message and "unable to open database file" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    if where == "missing_dir":
        assert "does not exist" in message


def test_garbage_urls_give_store_errors() -> None:
    for url, match in [("mysql://u:pw@host/db", "unsupported"), ("postgresql+nodriver://x@y/z", "cannot open")]:
        with pytest.raises(StoreError, match=match) as info:
            Store(url)
        assert "pw" not in str(info.value)


@pytest.mark.parametrize("order", ["optuna_first", "ws_tune_first"])
def test_optuna_tables_coexist(db_url: str, open_db: Callable[[str], Store], factories: Any, order: str) -> None:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def optuna_round(study_name: str, n_trials: int = 2) -> int:
        storage = optuna.storages.RDBStorage(db_url)
        try:
            study = optuna.create_study(storage=storage, study_name=study_name, load_if_exists=True)
            study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=n_trials)
            return len(study.trials)
        finally:
            storage.remove_session()
            storage.engine.dispose()

    if order == "ws_tune_first":
        open_db(db_url).close()
    optuna_round("first")
    optuna_tables = _tables(db_url) - WS_TABLES
    optuna_version = _execute(db_url, "SELECT version_num FROM alembic_version")[0]
    assert "studies" in optuna_tables and "alembic_version" in optuna_tables

    store = open_db(db_url)  # fresh for ws-tune when Optuna came first: must migrate anyway
    wid = store.workload_id(factories.key())
    cand = factories.candidate(0)
    store.commit_trial(workload_id=wid, candidate=cand, result=factories.result(cand))
    assert upgrade(db_url) == head_revision()
    optuna_round("second")

    assert _tables(db_url) == optuna_tables | WS_TABLES
    assert _execute(db_url, "SELECT version_num FROM alembic_version")[0] == optuna_version
    assert _execute(db_url, f"SELECT version_num FROM {VERSION_TABLE}")[0] == [(head_revision(),)]
    assert optuna_round("first", n_trials=1) == 3  # Optuna's first study is intact and usable
    assert store.top_k(workload_id=wid)[0].candidate == cand
