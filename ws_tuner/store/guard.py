"""Bounded database waits: no call into PostgreSQL may wait forever.

libpq waits without limit by default: for a host that does not answer, for a
lock, for a statement, and for the reply to a query sent over a connection
whose peer stopped answering (a hung proxy, a frozen VM, a partition the
kernel has not noticed). Each wait gets a bound here:

* connecting: libpq's ``connect_timeout``;
* a peer that is gone: TCP keepalives, and ``tcp_user_timeout`` (the kernel
  gives up on data left unacknowledged);
* statements and locks: the server's ``statement_timeout`` and ``lock_timeout``
  (and ``idle_in_transaction_session_timeout``: a session whose client went
  silent inside a transaction would hold its row locks for ever);
* a peer that acknowledges every packet and never answers (a proxy that
  forwards nothing): only the client can tell. A watchdog thread shuts down
  the socket of any connection held out of its pool longer than ``checkout``
  seconds (``ping`` seconds for the check made when it is taken out); the call
  waiting on it fails at once, the pool drops it and every connection older
  than it, and the caller's retry gets a fresh one. That check replaces
  SQLAlchemy's ``pool_pre_ping``, which runs before any listener could watch it.

SQLite waits only for another writer's lock, and its busy timeout bounds that.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import InvalidatePoolError

_log = logging.getLogger(__name__)
RECENT_S = 1.0  # a pooled connection returned this recently is taken out unchecked


@dataclass(frozen=True)
class DbTimeouts:
    connect: int = 5  # libpq counts whole seconds (at least 2)
    statement: float = 15.0
    lock: float = 5.0
    checkout: float = 20.0  # a connection held out of the pool longer is cut
    ping: float = 5.0  # the check of a pooled connection as it is taken out

    @classmethod
    def within(cls, seconds: float) -> "DbTimeouts":
        """Bounds under which one database call finishes or fails in about ``seconds``."""
        connect = int(min(max(2, seconds / 3), 10))
        return cls(connect=connect, statement=seconds, lock=seconds / 2, checkout=seconds + connect, ping=connect)

    def connect_args(self, query: Any = ()) -> dict[str, Any]:
        """libpq's connection parameters for the bounds (those the URL does not set itself)."""
        args = {
            "connect_timeout": self.connect,
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.checkout * 1000),
        }
        return {k: v for k, v in args.items() if k not in query}


class _Watchdog:
    """Connections held out of their pools, with deadlines; one thread per process."""

    INTERVAL = 0.25

    def __init__(self) -> None:
        self._held: dict[int, tuple[float, Any, Engine]] = {}  # id(record) -> (deadline, dbapi connection, its engine)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, record: Any, dbapi_connection: Any, seconds: float, engine: Engine) -> None:
        with self._lock:
            self._held[id(record)] = (time.monotonic() + seconds, dbapi_connection, engine)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ws-tune-db-watchdog", daemon=True)
                self._thread.start()

    def release(self, record: Any) -> None:
        with self._lock:
            self._held.pop(id(record), None)

    def cut(self, engine: Engine | None = None) -> int:
        """Cut every held connection (of ``engine``, or past its deadline when None)."""
        now = time.monotonic()
        cut = 0
        with self._lock:  # cut under the lock: a connection checked in meanwhile is not touched
            for key, (deadline, connection, owner) in list(self._held.items()):
                if (owner is engine) if engine is not None else deadline <= now:
                    del self._held[key]
                    cut += _shutdown(connection)
        return cut

    def _run(self) -> None:
        while True:
            time.sleep(self.INTERVAL)
            if self.cut():
                _log.warning("cut a database connection that did not answer in time")


_watchdog = _Watchdog()


def _shutdown(dbapi_connection: Any) -> int:
    """Shut the connection's socket down: the call blocked on it returns with an error."""
    try:
        fd = dbapi_connection.pgconn.socket
    except Exception:  # noqa: BLE001 - already closed: nothing waits on it
        return 0
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return 0
    return 1


def session_settings(timeouts: DbTimeouts) -> list[str]:
    """The server-side bounds of a new PostgreSQL connection (the engine's, and the
    best lookup's own: bestread.py)."""
    return [
        f"SET statement_timeout = {int(timeouts.statement * 1000)}",
        f"SET lock_timeout = {int(timeouts.lock * 1000)}",
        # Every transaction here takes milliseconds; one idle this long has lost its client
        # (the job queue tightens this to its grace period: engine.abort_stalled_transactions).
        f"SET idle_in_transaction_session_timeout = {int(timeouts.checkout * 3000)}",
    ]


def configure_postgresql_session(dbapi_connection: Any, timeouts: DbTimeouts) -> None:
    with dbapi_connection.cursor() as cursor:
        for statement in session_settings(timeouts):
            cursor.execute(statement)
    dbapi_connection.commit()


def guard_postgresql(engine: Engine, timeouts: DbTimeouts) -> None:
    """Bound every wait of ``engine``'s connections (see the module docstring).
    Create the engine without ``pool_pre_ping``: the checkout check here replaces it."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        _watchdog.hold(record, dbapi_connection, timeouts.ping, engine)
        record.info["ws_tune_fresh"] = True
        configure_postgresql_session(dbapi_connection, timeouts)

    def on_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # A connection that worked moments ago needs no check (under load, that is
        # every checkout: the check would be a round trip per call); one that sat
        # in the pool longer is checked, as one just opened is not.
        returned = record.info.pop("ws_tune_returned", None)
        if record.info.pop("ws_tune_fresh", False) or (returned is not None and time.monotonic() - returned < RECENT_S):
            _watchdog.hold(record, dbapi_connection, timeouts.checkout, engine)
            return
        _watchdog.hold(record, dbapi_connection, timeouts.ping, engine)
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # noqa: BLE001 - any failure means the connection is unusable
            _watchdog.release(record)
            # The others of its age likely share its fate (a restart, a partition): drop them all.
            raise InvalidatePoolError(f"connection check failed: {exc}") from exc
        _watchdog.hold(record, dbapi_connection, timeouts.checkout, engine)

    def on_checkin(dbapi_connection: Any, record: Any) -> None:
        _watchdog.release(record)
        if dbapi_connection is not None:
            record.info["ws_tune_returned"] = time.monotonic()

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)


def interrupt(engine: Engine) -> int:
    """Cut every connection ``engine`` has out of its pool now: calls waiting on
    them fail at once (a worker told to stop while the database does not answer)."""
    return _watchdog.cut(engine)
