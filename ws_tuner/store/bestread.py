"""The best-schedule lookup's hot path (``Store.best_stored_fast``): the statement of
``Store.best_stored``, compiled once by SQLAlchemy and then run straight on the
driver, over connections kept for it alone.

Why: an uncached ``GET /best`` is this one indexed query, and SQLAlchemy's
execution around it (pool checkout and its events, parameter processing, result
metadata for two dozen columns) cost more CPU than the query itself. Here a call
is a pop from a stack of idle connections, one execute of a statement the driver
has prepared (psycopg: ``prepare=True``; sqlite3: its statement cache), and the
row's values converted by the very result processors SQLAlchemy would apply,
so the answer is the one ``best_stored`` gives (tests/store/test_store_best.py
checks both paths against each other).

From an event loop (the server's lookups), a hop into the server's thread pool
and back cost more CPU than the query itself (the GIL passed among its dozens of
threads on two cores), so: SQLite is read in place, on the loop, for a read of one
indexed row takes tens of microseconds and a reader in WAL mode does not wait for
writers; on PostgreSQL, ``Coalesced`` sends the lookups that arrive together as one
statement, from the loop itself (``all_on_loop``, psycopg's AsyncConnection).

The guarantees of the store's own connections hold here too: they are opened
with the engine's connection arguments and set up as the engine's (``connect``
listeners: SQLite's WAL and BEGIN control, PostgreSQL's server-side bounds), a
PostgreSQL connection is watched by the guard's watchdog while a query is out
(and cut by ``Database.interrupt``), and a connection that failed is dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Select

from .engine import Database, StoreError, _sqlite_on_connect, connect_args_for, one_line
from .guard import RECENT_S, _watchdog, configure_postgresql_session, session_settings

Row = tuple[Any, ...]
# How long a read on the event loop may wait for SQLite's lock. A reader in WAL mode
# does not wait for writers, but a file without WAL (a filesystem that refuses it) or
# a checkpoint's reset can make it wait; the engine's busy timeout (seconds) would then
# stall every request of the server. Past this, the lookup is a 503 to retry.
SQLITE_LOOP_BUSY_MS = 250


class RawQuery:
    """One SELECT of SQLAlchemy Core, run on raw driver connections of ``db``'s
    database; rows come back as tuples in the select's column order, with each
    column's value as SQLAlchemy would return it."""

    def __init__(self, db: Database, statement: Select[Any], *, max_idle: int) -> None:
        engine = db.engine
        dialect = engine.dialect
        self.db, self.engine, self.max_idle = db, engine, max_idle
        self.pg = dialect.name == "postgresql"
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        # The statement's own bound values (status 'ok', the excluded lowering), merged
        # with the caller's by name; positional drivers (sqlite3: qmark) get them in order.
        self._defaults = dict(compiled.params)  # the caller's names unset here, given at each call
        self._order = compiled.positiontup if compiled.positional else None
        if self.pg:
            # The statement's constants written in: the generic plan kept below must see them (with
            # them as parameters it estimated the excluded lowering as matching one row, and read
            # a 100,000-trial workload through a sort in 430 ms instead of the rank index in 0.1).
            constants = {name: value for name, value in self._defaults.items() if value is not None}
            for name, value in constants.items():
                self.sql = self.sql.replace(f"%({name})s", _pg_literal(value))
            self._defaults = {name: value for name, value in self._defaults.items() if name not in constants}
        self._types = [column.type.dialect_impl(dialect) for column in statement.selected_columns]
        self._processors: list[tuple[int, Callable[[Any], Any]]] | None = None  # from the first result's column types
        self._cargs, self._cparams = dialect.create_connect_args(engine.url)
        self._connect_args = connect_args_for(engine.url, db.timeouts)  # as the engine connects
        if not self.pg:
            self._connect_args["timeout"] = SQLITE_LOOP_BUSY_MS / 1000
        self._idle: list[tuple[Any, float]] = []  # LIFO: (connection, when it was last returned)
        self._lock = threading.Lock()
        self._closed = False
        self._loop_idle: list[tuple[Any, float]] = []  # all_on_loop's psycopg AsyncConnections (PostgreSQL)
        self._loop_of_idle: asyncio.AbstractEventLoop | None = None  # the loop they were opened on

    def _connect(self) -> Any:
        connection = self.engine.dialect.loaded_dbapi.connect(*self._cargs, **{**self._cparams, **self._connect_args})
        try:
            if self.pg:
                configure_postgresql_session(connection, self.db.timeouts)
                connection.autocommit = True  # one SELECT: no BEGIN/ROLLBACK round trips
                for statement in _plan_settings(connection):
                    connection.execute(statement)
            else:
                _sqlite_on_connect(connection, None)  # autocommit: a SELECT reads one consistent snapshot by itself
        except BaseException:
            connection.close()
            raise
        return connection

    def params(self, values: dict[str, Any]) -> Any:
        merged = {**self._defaults, **values}
        return merged if self._order is None else [merged[name] for name in self._order]

    def all(self, values: dict[str, Any]) -> list[Row]:
        """Every row of the statement with ``values`` bound; ``StoreError`` on failure."""
        params = self.params(values)
        for attempt in (0, 1):
            connection, returned = self._take()
            try:
                cursor = self._run(connection, params, recent=time.monotonic() - returned < RECENT_S)
                rows = cursor.fetchall()
                if self._processors is None:
                    self._processors = self._result_processors(cursor.description)
            except self.engine.dialect.loaded_dbapi.Error as exc:
                connection.close()
                # A pooled connection that sat idle may have died with a server restart:
                # one retry on a fresh one, as the engine's checkout check would (a read is safe to repeat).
                if attempt == 0 and returned > 0 and isinstance(exc, self.engine.dialect.loaded_dbapi.OperationalError):
                    continue
                raise self.db.error(exc) from None
            self._give_back(connection)
            return [self._convert(row) for row in rows] if self._processors else rows
        raise AssertionError("unreachable")

    def _result_processors(self, description: Any) -> list[tuple[int, Callable[[Any], Any]]]:
        """What SQLAlchemy applies to each column's values, by the driver's type code
        (SQLite's DATETIME text to datetime, its 0/1 to bool; next to nothing on psycopg)."""
        dialect = self.engine.dialect
        found = (impl.result_processor(dialect, column[1]) for impl, column in zip(self._types, description, strict=True))
        return [(i, process) for i, process in enumerate(found) if process is not None]

    def _run(self, connection: Any, params: Any, *, recent: bool) -> Any:
        """A cursor on the statement's result."""
        if not self.pg:
            return connection.execute(self.sql, params)
        # Watched while the query is out, as the engine's connections are (guard.py).
        timeouts = self.db.timeouts
        _watchdog.hold(connection, connection, timeouts.checkout if recent else timeouts.ping, self.engine)
        try:
            return connection.execute(self.sql, params, prepare=True)
        finally:
            _watchdog.release(connection)

    def _convert(self, row: Row) -> Row:
        values = list(row)
        for i, process in self._processors:
            values[i] = process(values[i])
        return tuple(values)

    def _take(self) -> tuple[Any, float]:
        """An idle connection and when it was returned (0.0: just opened)."""
        try:
            return self._idle.pop()  # list.pop is atomic: no lock on the hot path
        except IndexError:
            pass
        if self._closed:
            raise StoreError(f"ws-tune database at {self.db.display_url}: the store is closed")
        try:
            return self._connect(), 0.0
        except self.engine.dialect.loaded_dbapi.Error as exc:
            raise StoreError(f"cannot open ws-tune database at {self.db.display_url}: {one_line(exc)}") from None

    def _give_back(self, connection: Any) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append((connection, time.monotonic()))
                return
        connection.close()

    # --- from the event loop -----------------------------------------------------

    async def all_on_loop(self, values: dict[str, Any]) -> list[Row]:
        """``all`` on the calling event loop over psycopg's AsyncConnection (PostgreSQL),
        for a caller that sends few statements, each for many callers (``Coalesced``):
        then the async driver's waits cost less than handing each result from a thread
        back to the loop, which waited for the loop to let go of the GIL (up to the
        interpreter's 5 ms switch interval each time: the p99 of uncached lookups)."""
        params = self.params(values)
        dbapi = self.engine.dialect.loaded_dbapi
        loop = asyncio.get_running_loop()
        if loop is not self._loop_of_idle:  # an async connection waits on the loop it was opened on
            stale, self._loop_idle, self._loop_of_idle = self._loop_idle, [], loop
            for connection, _ in stale:
                connection.pgconn.finish()
        for attempt in (0, 1):
            connection, returned = self._loop_idle.pop() if self._loop_idle else (await self._connect_on_loop(), 0.0)
            timeouts = self.db.timeouts
            _watchdog.hold(connection, connection, timeouts.checkout if time.monotonic() - returned < RECENT_S else timeouts.ping, self.engine)
            try:
                cursor = await connection.execute(self.sql, params, prepare=True)
                rows = await cursor.fetchall()
                if self._processors is None:
                    self._processors = self._result_processors(cursor.description)
            except dbapi.Error as exc:
                await connection.close()
                if attempt == 0 and returned > 0 and isinstance(exc, dbapi.OperationalError):
                    continue  # a connection that sat idle may have died with a server restart: one retry
                raise self.db.error(exc) from None
            finally:
                _watchdog.release(connection)
            if self._closed or len(self._loop_idle) >= self.max_idle:
                await connection.close()
            else:
                self._loop_idle.append((connection, time.monotonic()))
            return [self._convert(row) for row in rows] if self._processors else rows
        raise AssertionError("unreachable")

    async def _connect_on_loop(self) -> Any:
        if self._closed:
            raise StoreError(f"ws-tune database at {self.db.display_url}: the store is closed")
        from psycopg import AsyncConnection

        try:
            connection = await AsyncConnection.connect(*self._cargs, **{**self._cparams, **self._connect_args}, autocommit=True)
        except self.engine.dialect.loaded_dbapi.Error as exc:
            raise StoreError(f"cannot open ws-tune database at {self.db.display_url}: {one_line(exc)}") from None
        try:  # what _connect sets up, on the loop (autocommit: each SET holds for the session)
            for statement in [*session_settings(self.db.timeouts), *_plan_settings(connection)]:
                await connection.execute(statement)
        except BaseException:
            await connection.close()
            raise
        return connection

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            loop_idle, self._loop_idle = self._loop_idle, []
        for connection, _ in idle:
            connection.close()
        for connection, _ in loop_idle:  # from outside their loop: libpq's own close, which does not wait
            connection.pgconn.finish()


class Coalesced:
    """Calls of one query with different keys, from an event loop, answered together:
    the keys that arrive while ``in_flight`` statements are out go in the next one,
    a statement of ``many`` that takes each key column as an array and leads each row
    with the 1-based position of the key it answers.

    Why: under load an uncached lookup on PostgreSQL cost ~370 us of CPU (the driver's
    execute ~110, the thread hop ~40, the server's execution ~100 on the same cores);
    one statement for the lookups that arrived together pays those once, sent from the
    loop itself (``RawQuery.all_on_loop``: no thread, no wait for the GIL). Nothing is
    held back: a lone call goes out at once, as it would alone, and the batches grow
    only while earlier statements are out. Every answer is read after its call began."""

    def __init__(self, many: RawQuery, names: tuple[str, ...], *, in_flight: int = 2, max_batch: int = 256) -> None:
        self.many, self.names, self.in_flight, self.max_batch = many, names, in_flight, max_batch
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[list[Row]]]] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop whose calls are being batched
        # The statements out, until their answers are delivered (the loop keeps only weak references to tasks).
        self._sent: set[asyncio.Task[list[Row]]] = set()

    async def all(self, values: dict[str, Any]) -> list[Row]:
        """The rows ``values``' key would get alone (without the leading position)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._waiting or self._sent:  # another loop's batch is under way: this call goes alone
                return [row[1:] for row in await asyncio.to_thread(self.many.all, self._arrays([values]))]
            self._loop = loop
        answer: asyncio.Future[list[Row]] = loop.create_future()
        self._waiting.append((values, answer))
        if not self._scheduled and len(self._sent) < self.in_flight:
            # After the callbacks already due in this turn of the loop: the requests read
            # in the same turn join this statement.
            self._scheduled = True
            loop.call_soon(self._send, loop)
        return await answer

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = False
        while self._waiting and len(self._sent) < self.in_flight:
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            sent = loop.create_task(self.many.all_on_loop(self._arrays([values for values, _ in batch])))
            self._sent.add(sent)
            sent.add_done_callback(lambda done, batch=batch: self._deliver(loop, batch, done))

    def _arrays(self, keys: list[dict[str, Any]]) -> dict[str, list[Any]]:
        return {f"{name}_list": [values[name] for values in keys] for name in self.names}

    def _deliver(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[Any, asyncio.Future[list[Row]]]], done: asyncio.Task[list[Row]]) -> None:
        self._sent.discard(done)
        error = StoreError("the lookup was cancelled: the store is closing") if done.cancelled() else done.exception()
        answers: list[list[Row]] = [[] for _ in batch]
        if error is None:
            for row in done.result():
                answers[row[0] - 1].append(row[1:])
        for (_, answer), rows in zip(batch, answers, strict=True):
            if not answer.done():  # a caller that gave up (its client went away) is cancelled
                answer.set_exception(error) if error is not None else answer.set_result(rows)
        if self._waiting and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send, loop)


def _pg_literal(value: Any) -> str:
    """A constant of the statement as PostgreSQL text (a '%' doubled for the driver's placeholders)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"no literal for {value!r} in the best lookup's statement")
    text = str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
    return text.replace("%", "%%")


def _plan_settings(connection: Any) -> list[str]:
    """Keep the prepared statement's generic plan. PostgreSQL's default re-plans a
    prepared statement for each execution's values while it estimates a custom plan
    cheaper; for this statement that meant planning every time, two thirds of the
    server's CPU for a lookup (330 us against 110 us). The generic plan reads the
    same indexes whatever the key (tests/store/test_store_best.py checks the plan)."""
    return ["SET plan_cache_mode = force_generic_plan"] if connection.info.server_version >= 120000 else []
