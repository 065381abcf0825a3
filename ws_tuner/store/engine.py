"""The store's engine and sessions: URLs, connections, transactions, and the
one place where SQLite and PostgreSQL differ (``Sql``).

* A ``Database`` shares one engine (a connection pool) and opens a fresh
  session per call, so it is thread-safe; several processes may share one
  database: SQLite in WAL mode with write transactions serialized by ``BEGIN
  IMMEDIATE``, or PostgreSQL with every wait bounded (guard.py).
* Failures of the database become ``StoreError`` with a one-line message that
  names the URL (password masked) and the cause.
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Select, create_engine, event, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, InvalidatePoolError, NoSuchModuleError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from .guard import DbTimeouts, guard_postgresql, interrupt

_log = logging.getLogger(__name__)

ENV_VAR = "WS_TUNE_DB"
SQLITE_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's write lock


class StoreError(RuntimeError):
    """The store cannot be opened or used. The message is one line, fit for a CLI."""


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


def one_line(exc: BaseException) -> str:
    """A driver error in one line."""
    # DBAPIError.orig is the driver's own error, without SQLAlchemy's SQL echo and
    # "Background on this error" link; libpq messages span lines, so fold them.
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split()) or type(orig).__name__


def open_failure(url: str, exc: BaseException) -> StoreError:
    """The error for a database that cannot be reached, with the likely cause of a SQLite path."""
    message = f"cannot open ws-tune database at {mask_url(url)}: {one_line(exc)}"
    with suppress(ArgumentError):
        sa_url = make_url(url)
        if sa_url.get_backend_name() == "sqlite" and sa_url.database not in (None, "", ":memory:"):
            directory = Path(sa_url.database).resolve().parent
            if not directory.is_dir():
                message += f" (directory {directory} does not exist)"
            elif not os.access(directory, os.W_OK):
                message += f" (directory {directory} is not writable)"
    return StoreError(message)


# --- engines ------------------------------------------------------------------


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


def connect_args_for(sa_url: URL, timeouts: DbTimeouts | None = None) -> dict[str, Any]:
    """The driver's connection arguments for the store's treatment of ``sa_url``
    (the store's engines, and Optuna's on the same database)."""
    if sa_url.get_backend_name() == "sqlite":
        # Sessions hop threads (worker pools); the pool hands each connection to one at a time.
        return {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
    return (timeouts or DbTimeouts()).connect_args(sa_url.query)


def configure_connections(engine: Engine, timeouts: DbTimeouts) -> None:
    """The store's treatment of ``engine``'s connections: SQLite's writers serialized
    (WAL, ``BEGIN IMMEDIATE``); every PostgreSQL wait bounded (guard.py)."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
    else:
        guard_postgresql(engine, timeouts)


def make_engine(url: str, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> Engine:
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
            engine = create_engine(sa_url, connect_args=connect_args_for(sa_url), **kwargs)
            configure_connections(engine, DbTimeouts())
            return engine
        if backend == "postgresql":
            if sa_url.drivername == "postgresql":
                # Plain postgresql:// means psycopg2 to SQLAlchemy; psycopg 3 is what ws-tune installs.
                sa_url = sa_url.set(drivername="postgresql+psycopg")
            connect_args = connect_args_for(sa_url, timeouts)
            if timeouts is None:
                # pre_ping: a connection killed by a server restart is replaced at checkout.
                return create_engine(sa_url, pool_pre_ping=True, connect_args=connect_args)
            # The guard checks a pooled connection at checkout, as pre_ping would, under a deadline.
            engine = create_engine(sa_url, connect_args=connect_args, **pool)
            configure_connections(engine, timeouts)
            return engine
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"cannot open ws-tune database at {mask_url(url)}: {one_line(exc)}") from None
    raise StoreError(f"unsupported database {mask_url(url)}: ws-tune stores results in SQLite or PostgreSQL")


# --- the dialects' differences --------------------------------------------------


class Sql:
    """The SQL that differs between SQLite and PostgreSQL, in one place."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.pg = dialect == "postgresql"

    def now(self) -> Any:
        """The database clock. PostgreSQL's now() has microseconds; SQLite's
        CURRENT_TIMESTAMP only seconds, too coarse for heartbeats, so it gets
        milliseconds from strftime."""
        return func.now() if self.pg else func.strftime("%Y-%m-%d %H:%M:%f", "now")

    def ago(self, seconds: float) -> Any:
        """The database clock ``seconds`` ago."""
        if self.pg:
            return func.now() - func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))
        return func.strftime("%Y-%m-%d %H:%M:%f", "now", f"-{float(seconds):.3f} seconds")

    def greatest(self, *values: Any) -> Any:
        # SQLite's two-argument max() is PostgreSQL's greatest().
        return func.greatest(*values) if self.pg else func.max(*values)

    def upsert(self, model: Any) -> Any:
        """An INSERT with ``on_conflict_do_nothing``/``on_conflict_do_update``: the
        same shape on both dialects, but each has its own insert()."""
        return (postgresql.insert if self.pg else sqlite.insert)(model)

    @staticmethod
    def skip_locked(query: Select[Any], **of: Any) -> Select[Any]:
        """Rows no other transaction holds, locked for this one: ``FOR UPDATE SKIP
        LOCKED`` on PostgreSQL. SQLite renders no lock: its write transactions are
        ``BEGIN IMMEDIATE`` and so already serialized."""
        return query.with_for_update(skip_locked=True, **of)

    def transaction_lock(self, connection: Connection, key: int) -> None:
        """Serialize the transactions that take ``key`` (PostgreSQL's advisory lock);
        SQLite's writers are serialized by ``BEGIN IMMEDIATE`` already."""
        if self.pg:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    def clock(self, session: Session) -> datetime:
        """The database clock's reading, as aware UTC."""
        value = session.scalar(select(self.now()))
        return utc(value if isinstance(value, datetime) else datetime.fromisoformat(str(value)))


def utc(value: datetime) -> datetime:
    """A stored time as aware UTC. SQLite returns naive datetimes of
    CURRENT_TIMESTAMP, which is UTC; PostgreSQL returns aware ones."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


_stall_guards: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


def abort_stalled_transactions(engine: Engine, seconds: float) -> None:
    """Have PostgreSQL end a session of ``engine`` that sits inside a transaction
    for ``seconds`` (PostgreSQL only: SQLite has no server to end it).

    Every queue transaction takes milliseconds; one left open means its process is
    stalled (SIGSTOP, a debugger, a frozen VM) while holding row locks (a job's row,
    say) that would stall every other worker until it resumed. The server then
    aborts it, the locks go, and the stalled worker's leases expire as usual. The
    same holds for the Optuna storage's engine (a study's rows)."""
    if engine.dialect.name != "postgresql" or _stall_guards.get(engine) == seconds:
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {int(seconds * 1000)}")
        dbapi_connection.commit()

    event.listen(engine, "connect", on_connect)
    _stall_guards[engine] = seconds
    engine.dispose()  # pooled connections predate the setting


def close_for_good(engine: Engine) -> int:
    """Cut ``engine``'s connections in use (guard.interrupt) and refuse every later
    connect and checkout at once: for an engine whose owner is leaving, in front of
    a library that retries on its own. Optuna makes a trial up to five times,
    sleeping up to 2 s between attempts, and on a silent database each attempt
    costs a connect timeout: ~14 s past the drain, SIGTERM ignored (seen in CI).
    A refusal is a StoreError, which Optuna does not take for a driver error."""

    def refuse(*_: Any) -> None:
        raise StoreError(f"database at {engine.url.render_as_string(hide_password=True)}: closed, its user is leaving")

    def invalidate(*_: Any) -> None:  # a checkout refused so: the pool drops the connection and connects anew, refused
        raise InvalidatePoolError("closed for good")

    event.listen(engine, "do_connect", refuse, insert=True)
    event.listen(engine, "checkout", invalidate, insert=True)  # before guard.py's check of a pooled connection
    return interrupt(engine)


# --- the database ---------------------------------------------------------------


class Database:
    """One database: its engine, short transactions on it, and its dialect's SQL."""

    def __init__(self, url: str, *, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> None:
        self.url = url
        self.display_url = mask_url(url)  # for messages: never shows a password
        self.timeouts = timeouts or DbTimeouts()
        self.engine = make_engine(url, self.timeouts, pool_size)
        self._read_engine = self.engine.execution_options(ws_tune_read_only=True)
        self.sql = Sql(self.engine.dialect.name)
        # Lookups need no transaction: on PostgreSQL each read runs in autocommit (no
        # BEGIN/ROLLBACK round trips). Not on SQLite, where the driver's default isolation,
        # restored when a connection goes back, would take back our control of BEGIN.
        self.lookup_engine = (
            self._read_engine.execution_options(isolation_level="AUTOCOMMIT") if self.dialect == "postgresql" else self._read_engine
        )
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT") if self.sql.pg else self.engine

    @property
    def dialect(self) -> str:
        """"postgresql" or "sqlite"."""
        return self.sql.dialect

    def close(self) -> None:
        self.engine.dispose()

    def interrupt(self) -> int:
        """Make every call now waiting on the database fail at once (see guard.py)."""
        return interrupt(self.engine)

    def error(self, exc: BaseException) -> StoreError:
        return StoreError(f"ws-tune database at {self.display_url}: {one_line(exc)}")

    def transaction(self) -> AbstractContextManager[Connection]:
        """A Core connection in one write transaction (no ORM session to set up: the
        trial writes); commits on success, driver errors become ``StoreError``."""
        return self._connection(self.engine, begin=True)

    def statement(self) -> AbstractContextManager[Connection]:
        """A Core connection for one write statement, atomic by itself: on PostgreSQL
        in autocommit (no BEGIN and COMMIT round trips); on SQLite in a transaction,
        for its writers are serialized by ``BEGIN IMMEDIATE``."""
        return self._connection(self._autocommit, begin=not self.sql.pg)

    @contextmanager
    def _connection(self, engine: Engine, *, begin: bool) -> Iterator[Connection]:
        try:
            with engine.begin() if begin else engine.connect() as connection:
                yield connection
        except DBAPIError as exc:
            raise self.error(exc) from None

    @contextmanager
    def session_scope(self, *, read_only: bool = False, ignore_integrity_error: bool = False) -> Iterator[Session]:
        """A session in one transaction: commit on success, roll back on error.

        ``ignore_integrity_error`` is for inserts that may lose a race: the loser's
        transaction is rolled back silently and the caller re-reads (the rest of
        the ``with`` body is skipped). Driver errors become ``StoreError``.
        """
        session = Session(self._read_engine if read_only else self.engine, expire_on_commit=False)
        try:
            yield session
            session.commit()
        except IntegrityError as exc:
            with suppress(DBAPIError):
                session.rollback()
            if not ignore_integrity_error:
                raise self.error(exc) from None
            _log.debug("ignored a lost insert race: %s", one_line(exc))
        except DBAPIError as exc:
            with suppress(DBAPIError):
                session.rollback()
            raise self.error(exc) from None
        except BaseException:
            with suppress(DBAPIError):
                session.rollback()
            raise
        finally:
            session.close()
