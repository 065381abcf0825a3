"""The ws-tune store. SQL lives in the store package only: this module (results),
``queue.py`` (the service's jobs, slots and workers) and ``registry.py``
(kernels, API tokens, best-schedule lookups); both build on ``Store``.

Contracts (callers rely on these):

* Every method runs in its own short transaction and commits before returning,
  so a result survives the process being killed right after ``commit_trial``.
* A ``Store`` is thread-safe: it shares one engine (a connection pool) and opens
  a fresh session per call. Several processes may share one database: SQLite
  in WAL mode with write transactions serialized by ``BEGIN IMMEDIATE``, or
  PostgreSQL.
* Writes are idempotent upserts keyed by (workload, candidate): N workers that
  finish N trials leave exactly N rows, whatever the interleaving.
* Failures of the database become ``StoreError`` with a one-line message that
  names the URL (password masked) and the cause; callers never see a raw
  SQLAlchemy error. ``SchemaOutdatedError`` is the one a user fixes with
  ``ws-tune db upgrade``.
* Results come back as ``StoredTrial`` values, never ORM objects, so nothing
  outside this module can lazily touch the database.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine, Select, bindparam, create_engine, event, func, inspect, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.orm import Session, aliased
from sqlalchemy.pool import StaticPool

from ..candidate import Candidate, Lowering, canonical_json
from ..result import Status, Timing, TrialResult
from ..workload import WorkloadKey
from .guard import DbTimeouts, guard_postgresql, interrupt
from .models import VERSION_TABLE, Base, CandidateModel, TrialModel, WorkloadModel

_log = logging.getLogger(__name__)

ENV_VAR = "WS_TUNE_DB"
# The migrations (migrations/ in the repository) install as ws_tuner.migrations, so an
# installed wheel can create and upgrade its own schema without a checkout or an alembic.ini.
MIGRATIONS_DIR = Path(str(importlib.resources.files("ws_tuner.migrations")))
SQLITE_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's write lock
# pg_advisory_xact_lock key ("ws_tune" in ASCII) held while migrating, so that two
# workers opening a fresh database at once do not both create the tables.
_MIGRATION_LOCK_KEY = 0x77735F74756E65


class StoreError(RuntimeError):
    """The store cannot be opened or used. The message is one line, fit for a CLI."""


class SchemaOutdatedError(StoreError):
    """The database's schema is older than this ws-tune's; ``ws-tune db upgrade`` fixes it."""

    def __init__(self, url: str, current: str, head: str) -> None:
        self.current, self.head = current, head
        super().__init__(
            f"database at {url} has schema revision {current}; this ws-tune needs {head}: "
            f"run `ws-tune db upgrade --db {url}`"
        )


@dataclass(frozen=True)
class StoredTrial:
    """One stored outcome, detached from the database."""

    candidate: Candidate
    result: TrialResult
    workload_id: int
    created_at: datetime  # UTC, stamped by the database clock
    updated_at: datetime

    @property
    def status(self) -> Status:
        return self.result.status


# --- URLs ---------------------------------------------------------------------


def default_db_url() -> str:
    """The per-user SQLite file used when neither an argument nor $WS_TUNE_DB names one."""
    return f"sqlite:///{Path.home() / '.cache' / 'ws-tune' / 'ws-tune.db'}"


def resolve_db_url(url: str | None = None) -> str:
    """Explicit URL or path, else $WS_TUNE_DB, else ``default_db_url()``.

    A bare file path (no ``scheme://``) means a SQLite file; it is made absolute
    so that the URL printed in messages works from any directory.
    """
    url = url or os.environ.get(ENV_VAR) or default_db_url()
    if "://" not in url:
        url = f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # unparsable: still never echo a password
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def open_store(url: str | None = None, *, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> Store:
    """Open (and on first use, create) the store that ``resolve_db_url(url)`` names."""
    resolved = resolve_db_url(url)
    if not url and not os.environ.get(ENV_VAR):
        # Only the default location is created on demand: a path the user typed
        # with a missing directory is more likely a typo than a wish.
        directory = Path(resolved.removeprefix("sqlite:///")).parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the ws-tune cache directory {directory}: {exc.strerror}") from None
    return Store(resolved, timeouts=timeouts, pool_size=pool_size)


# --- Engine -------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    # DBAPIError.orig is the driver's own error, without SQLAlchemy's SQL echo and
    # "Background on this error" link; libpq messages span lines, so fold them.
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split()) or type(orig).__name__


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 driver: it skips BEGIN before SELECTs, and
    # we need to choose the transaction type ourselves (see _sqlite_on_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer, so a server can read leaderboards
    # while workers commit trials to the same file.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()
    # PRAGMA foreign_keys stays off (SQLite's default): Alembic's batch mode
    # rebuilds a table by drop-and-rename, which with enforcement on would
    # cascade-delete the trials of a rebuilt workloads table. PostgreSQL enforces.


def _sqlite_on_begin(connection: Connection) -> None:
    # A deferred transaction that reads and then writes fails at once with
    # "database is locked" when another writer committed in between (the busy
    # timeout does not apply to that upgrade). IMMEDIATE takes the write lock up
    # front and waits up to the busy timeout for it. Read-only sessions use a
    # plain BEGIN and never queue behind writers.
    read_only = connection.get_execution_options().get("ws_tune_read_only", False)
    # Straight to the driver: through SQLAlchemy's execution this took a tenth of a lookup.
    connection.connection.dbapi_connection.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _create_engine(url: str, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> Engine:
    """An engine for ``url``. With ``timeouts``, every wait of a PostgreSQL
    connection is bounded (guard.py); without, only connecting is (migrations,
    whose statements may take long). ``pool_size``: connections kept open (a
    server sizes it to its threads, so that load does not open and close
    connections); SQLAlchemy's default (5, and 10 more opened on demand) without."""
    try:
        sa_url = make_url(url)
    except ArgumentError:
        raise StoreError(f"not a database URL or file path: {mask_url(url)}") from None
    backend = sa_url.get_backend_name()
    pool: dict[str, Any] = {"pool_size": pool_size, "max_overflow": 10} if pool_size else {}
    try:
        if backend == "sqlite":
            kwargs: dict[str, Any] = dict(pool)
            if sa_url.database in (None, "", ":memory:"):
                # Each connection to :memory: is a new empty database: share one (tests only).
                kwargs = {"poolclass": StaticPool}
            engine = create_engine(
                sa_url,
                # Sessions hop threads (worker pools); the pool hands each connection to one at a time.
                connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
                **kwargs,
            )
            event.listen(engine, "connect", _sqlite_on_connect)
            event.listen(engine, "begin", _sqlite_on_begin)
            return engine
        if backend == "postgresql":
            if sa_url.drivername == "postgresql":
                # Plain postgresql:// means psycopg2 to SQLAlchemy; psycopg 3 is what ws-tune installs.
                sa_url = sa_url.set(drivername="postgresql+psycopg")
            connect_args = (timeouts or DbTimeouts()).connect_args(sa_url.query)
            if timeouts is None:
                # pre_ping: a connection killed by a server restart is replaced at checkout.
                return create_engine(sa_url, pool_pre_ping=True, connect_args=connect_args)
            # The guard checks a pooled connection at checkout, as pre_ping would, under a deadline.
            engine = create_engine(sa_url, connect_args=connect_args, **pool)
            guard_postgresql(engine, timeouts)
            return engine
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"cannot open ws-tune database at {mask_url(url)}: {_one_line(exc)}") from None
    raise StoreError(f"unsupported database {mask_url(url)}: ws-tune stores results in SQLite or PostgreSQL")


def _open_failure(url: str, exc: BaseException) -> StoreError:
    message = f"cannot open ws-tune database at {mask_url(url)}: {_one_line(exc)}"
    with suppress(ArgumentError):
        sa_url = make_url(url)
        if sa_url.get_backend_name() == "sqlite" and sa_url.database not in (None, "", ":memory:"):
            directory = Path(sa_url.database).resolve().parent
            if not directory.is_dir():
                message += f" (directory {directory} does not exist)"
            elif not os.access(directory, os.W_OK):
                message += f" (directory {directory} is not writable)"
    return StoreError(message)


# --- Schema -------------------------------------------------------------------


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config built in code; env.py takes the URL or a connection from ``attributes``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision() -> str:
    """The schema revision this ws-tune writes and expects."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def _known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _schema_state(connection: Connection) -> tuple[str | None, bool]:
    """(stamped revision, whether any ws-tune table exists)."""
    tables = set(inspect(connection).get_table_names())
    revision = None
    if VERSION_TABLE in tables:
        revision = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return revision, bool(tables & set(Base.metadata.tables))


def _migrate(engine: Engine, revision: str = "head") -> None:
    # One transaction for all of it: the tables and the stamp appear together or
    # not at all. Concurrent migrators serialize on a lock (SQLite: BEGIN IMMEDIATE,
    # PostgreSQL: an advisory lock); the later one finds the schema at head.
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(url: str) -> str | None:
    """The revision stamped in the database at ``url`` (None when it has none)."""
    engine = _create_engine(url)
    try:
        with engine.connect() as connection:
            return _schema_state(connection)[0]
    except DBAPIError as exc:
        raise _open_failure(url, exc) from None
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Apply the migrations up to head (a no-op at head); returns the new revision."""
    engine = _create_engine(url)
    try:
        _migrate(engine)
        with engine.connect() as connection:
            revision = _schema_state(connection)[0]
    except (DBAPIError, CommandError) as exc:
        raise StoreError(f"cannot upgrade ws-tune database at {mask_url(url)}: {_one_line(exc)}") from None
    finally:
        engine.dispose()
    assert revision is not None
    return revision


# --- Store --------------------------------------------------------------------


def _dumps(data: Any) -> str:
    # Sorted keys: equal payloads store equal text. default=str keeps odd values
    # (numpy scalars, paths) in `info` from failing a commit over a diagnostic.
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def _utc(value: datetime) -> datetime:
    # SQLite returns naive datetimes of CURRENT_TIMESTAMP, which is UTC;
    # PostgreSQL returns aware ones. Callers always get aware UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _to_stored(trial: TrialModel, candidate: CandidateModel) -> StoredTrial:
    timing = None
    if trial.median_ms is not None:
        timing = Timing(trial.median_ms, trial.p20_ms or 0.0, trial.p80_ms or 0.0, trial.reps or 0)
    data = {
        "lowering": candidate.lowering,
        "params": json.loads(candidate.params),
        "schedule": json.loads(candidate.schedule) if candidate.schedule else None,
    }
    result = TrialResult(
        candidate_hash=candidate.hash,
        status=Status(trial.status),
        message=trial.message,
        build_seconds=trial.build_seconds,
        timing=timing,
        tflops=trial.tflops,
        info=json.loads(trial.info),
        ratio=trial.ratio,
        confirmed=bool(trial.confirmed),
    )
    return StoredTrial(
        Candidate.from_json(data), result, trial.workload_id, _utc(trial.created_at), _utc(trial.updated_at)
    )


def _key_of(row: WorkloadModel) -> WorkloadKey:
    return WorkloadKey(
        kernel=row.kernel,
        source_hash=row.source_hash,
        problem=row.problem,
        arch=row.arch,
        device=row.device,
        tilelang_version=row.tilelang_version,
        cuda_version=row.cuda_version,
        driver_version=row.driver_version,
    )


# Best first: confirmed in the final tournament, then the ratio to the anchor (rows
# without one last), then time; the id breaks ties, for stable leaderboards.
RANK_ORDER = (TrialModel.confirmed.desc(), TrialModel.ratio.is_(None), TrialModel.ratio, TrialModel.median_ms, TrialModel.id)


@dataclass(frozen=True)
class StoredBest:
    """The best trial of a lookup as stored: the row's values and the candidate's
    canonical JSON, for an answer built without re-creating the candidate."""

    trial_id: int
    updated_at: datetime
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    tflops: float | None
    candidate_hash: str
    lowering: str
    params_json: str
    schedule_json: str | None
    key: WorkloadKey


# The best-schedule lookup, built once (rebuilding a select costs a fifth of a lookup),
# one statement: each workload of (kernel, source, problem, device), on any toolchain,
# with its fastest compilable trial, found by a correlated subquery that reads the
# first entry of the rank index (no sort, whatever the workload's size).
_BEST_ID = (
    select(TrialModel.id)
    .join(CandidateModel, TrialModel.candidate_id == CandidateModel.id)
    .where(
        TrialModel.workload_id == WorkloadModel.id,
        TrialModel.status == Status.OK.value,
        TrialModel.median_ms.is_not(None),
        # What tilelang can compile: a WS schedule or its own lowerings, never the vendor reference.
        CandidateModel.lowering != Lowering.REFERENCE.value,
    )
    .order_by(*RANK_ORDER)
    .limit(1)
    .correlate(WorkloadModel)
    .scalar_subquery()
)
_best = aliased(TrialModel, name="best")
_best_candidate = aliased(CandidateModel, name="best_candidate")
_BEST_AT = (
    select(
        WorkloadModel, _best.id.label("trial_id"), _best.updated_at, _best.median_ms, _best.p20_ms, _best.p80_ms, _best.reps,
        _best.tflops, _best.confirmed, _best.ratio, _best_candidate.hash.label("candidate_hash"), _best_candidate.lowering,
        _best_candidate.params, _best_candidate.schedule,
    )  # fmt: skip
    .select_from(WorkloadModel)
    .join(_best, _best.id == _BEST_ID)
    .join(_best_candidate, _best.candidate_id == _best_candidate.id)
    .where(
        WorkloadModel.kernel == bindparam("kernel"),
        WorkloadModel.source_hash == bindparam("source_hash"),
        WorkloadModel.problem == bindparam("problem"),
        WorkloadModel.device == bindparam("device"),
    )
)


def _rank(row: Any) -> tuple[Any, ...]:
    """RANK_ORDER in Python, to pick among the best trials of several workloads."""
    return (not row.confirmed, row.ratio is None, row.ratio or 0.0, row.median_ms, row.trial_id)


def _trials() -> Select[TrialModel, CandidateModel]:
    return select(TrialModel, CandidateModel).join(CandidateModel, TrialModel.candidate_id == CandidateModel.id)


def _upsert_trial(session: Session, insert: Any, *, workload_id: int, candidate: Candidate, result: TrialResult) -> StoredTrial:
    """``Store.commit_trial``'s statements inside the caller's transaction (the job
    queue records a trial and closes its slot in one transaction)."""
    if result.candidate_hash != candidate.hash:
        raise ValueError(f"result is for candidate {result.candidate_hash}, not {candidate.hash}")
    data = candidate.to_json()
    timing = result.timing
    values = {
        "status": Status(result.status).value,
        "message": result.message,
        "build_seconds": result.build_seconds,
        "median_ms": timing.median_ms if timing else None,
        "p20_ms": timing.p20_ms if timing else None,
        "p80_ms": timing.p80_ms if timing else None,
        "reps": timing.reps if timing else None,
        "tflops": result.tflops,
        "ratio": result.ratio,
        "confirmed": result.confirmed,
        "info": _dumps(result.info),
    }
    # Candidates are immutable and shared across workloads: insert once, never update.
    session.execute(
        insert(CandidateModel)
        .values(
            hash=candidate.hash,
            lowering=data["lowering"],
            params=canonical_json(data["params"]),
            schedule=canonical_json(data["schedule"]) if data["schedule"] is not None else None,
        )
        .on_conflict_do_nothing(index_elements=["hash"])
    )
    candidate_id = session.scalar(select(CandidateModel.id).where(CandidateModel.hash == candidate.hash))
    # A single atomic upsert rather than read-then-write: two workers
    # committing the same trial cannot both insert.
    stmt = insert(TrialModel).values(workload_id=workload_id, candidate_id=candidate_id, **values)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["workload_id", "candidate_id"],
            # ON CONFLICT skips ORM onupdate hooks, so updated_at is set here.
            set_={**{name: stmt.excluded[name] for name in values}, "updated_at": func.now()},
            where=or_(stmt.excluded.status != Status.BUILT.value, TrialModel.status == Status.BUILT.value),
        )
    )
    trial, cand = session.execute(
        _trials().where(TrialModel.workload_id == workload_id, TrialModel.candidate_id == candidate_id)
    ).one()
    return _to_stored(trial, cand)


class Store:
    """Results of ws-tune in a SQLite file or a PostgreSQL database."""

    def __init__(self, url: str, *, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> None:
        self.url = url
        self.display_url = mask_url(url)  # for messages: never shows a password
        self.timeouts = timeouts or DbTimeouts()
        self._engine = _create_engine(url, self.timeouts, pool_size)
        self._read_engine = self._engine.execution_options(ws_tune_read_only=True)
        # Lookups need no transaction: on PostgreSQL each read runs in autocommit (no
        # BEGIN/ROLLBACK round trips). Not on SQLite, where the driver's default isolation,
        # restored when a connection goes back, would take back our control of BEGIN.
        self._lookup_engine = (
            self._read_engine.execution_options(isolation_level="AUTOCOMMIT") if self.dialect == "postgresql" else self._read_engine
        )
        try:
            self._check_schema()
        except BaseException:
            self._engine.dispose()
            raise

    def _check_schema(self) -> None:
        # Connect eagerly: a wrong URL fails here, once, with a clear message,
        # rather than in the middle of a tuning run.
        try:
            with self._engine.connect() as connection:
                revision, has_tables = _schema_state(connection)
        except DBAPIError as exc:
            raise _open_failure(self.url, exc) from None
        head = head_revision()
        if revision is None and not has_tables:
            # Fresh for ws-tune (other tools' tables may be there): create the schema.
            try:
                _migrate(self._engine)
            except (DBAPIError, CommandError) as exc:
                raise StoreError(f"cannot create the ws-tune schema at {self.display_url}: {_one_line(exc)}") from None
            _log.info("created ws-tune schema %s at %s", head, self.display_url)
        elif revision is None:
            raise StoreError(
                f"database at {self.display_url} has ws-tune tables but no revision in {VERSION_TABLE}; "
                "it was not created by ws-tune's migrations"
            )
        elif revision != head:
            if revision in _known_revisions():
                raise SchemaOutdatedError(self.display_url, revision, head)
            raise StoreError(
                f"database at {self.display_url} has schema revision {revision}, unknown to this ws-tune "
                f"(head {head}): it was written by a newer ws-tune; upgrade ws-tune to use it"
            )

    @classmethod
    def upgrade(cls, url: str) -> str:
        """Apply the migrations up to head; returns the new revision."""
        return upgrade(url)

    def close(self) -> None:
        self._engine.dispose()

    def schema_revision(self) -> str | None:
        """The revision stamped in this store's database (readiness probes)."""
        try:
            with self._engine.connect() as connection:
                return _schema_state(connection)[0]
        except DBAPIError as exc:
            raise StoreError(f"ws-tune database at {self.display_url}: {_one_line(exc)}") from None

    def interrupt(self) -> int:
        """Make every call now waiting on the database fail at once (see guard.py)."""
        return interrupt(self._engine)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

    @contextmanager
    def session_scope(self, *, read_only: bool = False, ignore_integrity_error: bool = False) -> Iterator[Session]:
        """A session in one transaction: commit on success, roll back on error.

        ``ignore_integrity_error`` is for inserts that may lose a race: the loser's
        transaction is rolled back silently and the caller re-reads (the rest of
        the ``with`` body is skipped). Driver errors become ``StoreError``.
        """
        session = Session(self._read_engine if read_only else self._engine, expire_on_commit=False)
        try:
            yield session
            session.commit()
        except IntegrityError as exc:
            with suppress(DBAPIError):
                session.rollback()
            if not ignore_integrity_error:
                raise StoreError(f"ws-tune database at {self.display_url}: {_one_line(exc)}") from None
            _log.debug("ignored a lost insert race: %s", _one_line(exc))
        except DBAPIError as exc:
            with suppress(DBAPIError):
                session.rollback()
            raise StoreError(f"ws-tune database at {self.display_url}: {_one_line(exc)}") from None
        except BaseException:
            with suppress(DBAPIError):
                session.rollback()
            raise
        finally:
            session.close()

    def _insert(self, model: type[Base]) -> Any:
        # ON CONFLICT has the same shape on both dialects but lives in each one's insert().
        insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert
        return insert(model)

    @property
    def dialect(self) -> str:
        """"postgresql" or "sqlite"."""
        return self._engine.dialect.name

    # --- workloads ------------------------------------------------------------

    def _lookup_workload(self, key_hash: str) -> int | None:
        with self.session_scope(read_only=True) as session:
            return session.scalar(select(WorkloadModel.id).where(WorkloadModel.key_hash == key_hash))

    def workload_id(self, key: WorkloadKey) -> int:
        """The id of ``key``'s workload, created on first use. Safe against concurrent callers."""
        key_hash = key.hash
        found = self._lookup_workload(key_hash)
        if found is not None:
            return found
        with self.session_scope(ignore_integrity_error=True) as session:
            session.add(WorkloadModel(key_hash=key_hash, **key.to_json()))
        # Our insert or a concurrent one (whose twin we just rolled back) left the row.
        found = self._lookup_workload(key_hash)
        if found is None:
            raise StoreError(f"ws-tune database at {self.display_url}: workload {key_hash} vanished after insert")
        return found

    def find_workloads(
        self,
        *,
        kernel: str | None = None,
        source_hash: str | None = None,
        problem: str | dict[str, Any] | None = None,
        device: str | None = None,
    ) -> list[tuple[int, WorkloadKey]]:
        """Workloads matching every given field, oldest first (for lookups and warm starts)."""
        query = select(WorkloadModel).order_by(WorkloadModel.id)
        if kernel is not None:
            query = query.where(WorkloadModel.kernel == kernel)
        if source_hash is not None:
            query = query.where(WorkloadModel.source_hash == source_hash)
        if problem is not None:
            problem_json = problem if isinstance(problem, str) else canonical_json(problem)
            query = query.where(WorkloadModel.problem == problem_json)
        if device is not None:
            query = query.where(WorkloadModel.device == device)
        with self.session_scope(read_only=True) as session:
            return [(row.id, _key_of(row)) for row in session.scalars(query)]

    # --- trials ---------------------------------------------------------------

    def commit_trial(self, *, workload_id: int, candidate: Candidate, result: TrialResult) -> StoredTrial:
        """Store ``result`` for ``candidate`` on the workload, committed before returning.

        One row per (workload, candidate): a later result replaces an earlier one,
        except that a BUILT result never replaces a final outcome (a runner's, or
        a build failure): re-building a resumed candidate must not erase its timing.
        Returns what is stored afterwards.
        """
        with self.session_scope() as session:
            return _upsert_trial(session, self._insert, workload_id=workload_id, candidate=candidate, result=result)

    def get_trial(self, *, workload_id: int, candidate_hash: str) -> StoredTrial | None:
        query = _trials().where(TrialModel.workload_id == workload_id, CandidateModel.hash == candidate_hash)
        with self.session_scope(read_only=True) as session:
            row = session.execute(query).first()
            return _to_stored(*row) if row else None

    def trials_by_hash(self, *, workload_id: int) -> dict[str, StoredTrial]:
        """Every stored outcome of the workload by candidate hash (what a resumed run skips)."""
        with self.session_scope(read_only=True) as session:
            rows = session.execute(_trials().where(TrialModel.workload_id == workload_id).order_by(TrialModel.id))
            return {cand.hash: _to_stored(trial, cand) for trial, cand in rows}

    def _fastest(self, query: Select[TrialModel, CandidateModel], k: int) -> list[StoredTrial]:
        if k <= 0:
            return []
        query = (
            query.where(TrialModel.status == Status.OK.value, TrialModel.median_ms.is_not(None))
            .order_by(*RANK_ORDER)
            .limit(k)
        )
        with self.session_scope(read_only=True) as session:
            return [_to_stored(trial, cand) for trial, cand in session.execute(query)]

    def top_k(self, *, workload_id: int, k: int = 10) -> list[StoredTrial]:
        """The ``k`` fastest correct (OK) trials of the workload, fastest first."""
        return self._fastest(_trials().where(TrialModel.workload_id == workload_id), k)

    def best(self, *, key: WorkloadKey) -> StoredTrial | None:
        """The fastest correct trial of ``key``'s workload; None if it has none (or no workload)."""
        query = _trials().join(WorkloadModel, TrialModel.workload_id == WorkloadModel.id)
        found = self._fastest(query.where(WorkloadModel.key_hash == key.hash), 1)
        return found[0] if found else None

    def best_stored(self, *, kernel: str, source_hash: str, problem: str, device: str) -> StoredBest | None:
        """The fastest correct compilable trial of one source of ``kernel`` at the canonical
        ``problem`` JSON on ``device``, on any toolchain; None if there is none. Its cost
        does not grow with the number of trials: each workload's best is its first
        entry in the rank index."""
        where = {"kernel": kernel, "source_hash": source_hash, "problem": problem, "device": device}
        try:
            with self._lookup_engine.connect() as connection:
                rows = connection.execute(_BEST_AT, where).all()
        except DBAPIError as exc:
            raise StoreError(f"ws-tune database at {self.display_url}: {_one_line(exc)}") from None
        if not rows:
            return None
        best = min(rows, key=_rank)
        return StoredBest(
            best.trial_id, _utc(best.updated_at), best.median_ms, best.p20_ms, best.p80_ms, best.reps, best.tflops,
            best.candidate_hash, best.lowering, best.params, best.schedule, _key_of(best),
        )  # fmt: skip

    def status_counts(self, *, workload_id: int) -> dict[str, int]:
        """How many trials of the workload are in each status (status value -> count)."""
        query = (
            select(TrialModel.status, func.count())
            .where(TrialModel.workload_id == workload_id)
            .group_by(TrialModel.status)
        )
        with self.session_scope(read_only=True) as session:
            return {status: count for status, count in session.execute(query)}
