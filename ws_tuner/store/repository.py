"""The store's results: workloads, candidates and trials (``Store``). The job
queue (``queue.py``) and the service registry (``registry.py``) share its
database.

Contracts (callers rely on these):

* Every method runs in its own short transaction and commits before returning,
  so a result survives the process being killed right after ``commit_trial``.
* A ``Store`` is thread-safe and may share its database with other processes
  (engine.py).
* Writes are idempotent upserts keyed by (workload, candidate): N workers that
  finish N trials leave exactly N rows, whatever the interleaving.
* Failures of the database become one-line ``StoreError``s; callers never see a
  raw SQLAlchemy error. ``SchemaOutdatedError`` is the one a user fixes with
  ``ws-tune db upgrade``.
* Results come back as ``StoredTrial`` values (records.py), never ORM objects.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ARRAY, Select, String, bindparam, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import aliased

from ..candidate import Candidate, Lowering, canonical_json
from ..result import Status, TrialResult
from ..workload import WorkloadKey
from .engine import ENV_VAR, Database, StoreError, resolve_db_url, utc
from .bestread import Coalesced, RawQuery
from .guard import DbTimeouts
from .models import CandidateModel, TrialModel, WorkloadModel
from .records import StoredTrial, stored_trial, workload_key
from .schema import ensure_schema, stamped_revision, upgrade
from .writes import upsert_trial, upsert_trials


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
    gbps: float | None
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
_ASKED_BY = ("kernel", "source_hash", "problem", "device")


def _best_at(asked: dict[str, Any]) -> Select[Any]:
    """The lookup of the workloads whose key columns equal ``asked``'s expressions."""
    return (
        select(
            WorkloadModel, _best.id.label("trial_id"), _best.updated_at, _best.median_ms, _best.p20_ms, _best.p80_ms,
            _best.reps, _best.tflops, _best.gbps, _best.confirmed, _best.ratio, _best_candidate.hash.label("candidate_hash"),
            _best_candidate.lowering, _best_candidate.params, _best_candidate.schedule,
        )  # fmt: skip
        .select_from(WorkloadModel)
        .join(_best, _best.id == _BEST_ID)
        .join(_best_candidate, _best.candidate_id == _best_candidate.id)
        .where(*(getattr(WorkloadModel, name) == asked[name] for name in _ASKED_BY))
    )


_BEST_AT = _best_at({name: bindparam(name) for name in _ASKED_BY})


# The same lookup for the raw driver (bestread.py): the columns a StoredBest needs, in
# a fixed order (the whole workload row's metadata cost more than the query's execution).
_KEY_FIELDS = tuple(f.name for f in dataclasses.fields(WorkloadKey))
_BEST_COLUMNS = (
    *(getattr(WorkloadModel, name) for name in _KEY_FIELDS), _best.id, _best.updated_at, _best.median_ms, _best.p20_ms,
    _best.p80_ms, _best.reps, _best.tflops, _best.gbps, _best.confirmed, _best.ratio, _best_candidate.hash, _best_candidate.lowering,
    _best_candidate.params, _best_candidate.schedule,
)  # fmt: skip
_BEST_ROW = _BEST_AT.with_only_columns(*_BEST_COLUMNS)
_N_KEY = len(_KEY_FIELDS)
# Many lookups in one statement (PostgreSQL): the keys come as one array per key column,
# each row of the answer led by the 1-based position of the key it answers. The server
# answers lookups that arrive together this way (bestread.Coalesced): one round trip and
# one execution in place of one per request.
_ASKED = (
    func.unnest(*(bindparam(f"{name}_list", type_=ARRAY(String)) for name in _ASKED_BY))
    .table_valued(*_ASKED_BY, with_ordinality="asked")
    .render_derived(name="asked")
)
_BEST_ROWS = _best_at({name: _ASKED.c[name] for name in _ASKED_BY}).with_only_columns(_ASKED.c.asked, *_BEST_COLUMNS)


# The in-process lookup (lookup.best_trial), for the raw driver too: one workload's
# fastest compilable trial, every column of the trial and its candidate in mapper order.
_TRIAL_ATTRS = tuple((attr.key, attr.columns[0]) for attr in TrialModel.__mapper__.column_attrs)
_CANDIDATE_ATTRS = tuple((attr.key, attr.columns[0]) for attr in CandidateModel.__mapper__.column_attrs)
_BEST_OF_WORKLOAD = (
    select(*(column for _, column in _TRIAL_ATTRS + _CANDIDATE_ATTRS))
    .join_from(TrialModel, CandidateModel, TrialModel.candidate_id == CandidateModel.id)
    .where(
        TrialModel.workload_id == bindparam("workload_id"),
        TrialModel.status == Status.OK.value,
        TrialModel.median_ms.is_not(None),
        CandidateModel.lowering != Lowering.REFERENCE.value,
    )
    .order_by(*RANK_ORDER)
    .limit(1)
)


def _trial_of_row(row: tuple[Any, ...]) -> StoredTrial:
    """A _BEST_OF_WORKLOAD row as ``top_k`` returns it (through the same ``stored_trial``)."""
    n = len(_TRIAL_ATTRS)
    trial = TrialModel(**{key: value for (key, _), value in zip(_TRIAL_ATTRS, row[:n], strict=True)})
    candidate = CandidateModel(**{key: value for (key, _), value in zip(_CANDIDATE_ATTRS, row[n:], strict=True)})
    return stored_trial(trial, candidate)


def _raw_rank(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """_rank on a _BEST_ROW tuple."""
    trial_id, median_ms, confirmed, ratio = row[_N_KEY], row[_N_KEY + 2], row[_N_KEY + 8], row[_N_KEY + 9]
    return (not confirmed, ratio is None, ratio or 0.0, median_ms, trial_id)


def _rank(row: Any) -> tuple[Any, ...]:
    """RANK_ORDER in Python, to pick among the best trials of several workloads."""
    return (not row.confirmed, row.ratio is None, row.ratio or 0.0, row.median_ms, row.trial_id)


def trials_query() -> Select[TrialModel, CandidateModel]:
    return select(TrialModel, CandidateModel).join(CandidateModel, TrialModel.candidate_id == CandidateModel.id)


def _stored_best(rows: list[tuple[Any, ...]]) -> StoredBest | None:
    """The best of _BEST_ROW's rows (one a toolchain) as ``best_stored`` returns it."""
    if not rows:
        return None
    best = min(rows, key=_raw_rank) if len(rows) > 1 else rows[0]
    key = WorkloadKey(*best[:_N_KEY])
    trial_id, updated_at, median_ms, p20_ms, p80_ms, reps, tflops, gbps, _, _, candidate_hash, lowering, params, schedule = best[_N_KEY:]
    return StoredBest(
        trial_id, utc(updated_at), median_ms, p20_ms, p80_ms, reps, tflops, gbps, candidate_hash, lowering, params, schedule, key
    )  # fmt: skip


class Store(Database):
    """Results of ws-tune in a SQLite file or a PostgreSQL database."""

    def __init__(self, url: str, *, timeouts: DbTimeouts | None = None, pool_size: int | None = None) -> None:
        super().__init__(url, timeouts=timeouts, pool_size=pool_size)
        # best_stored_fast's statement on the raw driver (connections opened on first use); not
        # for a SQLite database in memory, which exists only in the engine's one connection.
        in_memory = self.dialect == "sqlite" and self.engine.url.database in (None, "", ":memory:")
        self._best_query = None if in_memory else RawQuery(self, _BEST_ROW, max_idle=pool_size or 5)
        self._best_of_workload = None if in_memory else RawQuery(self, _BEST_OF_WORKLOAD, max_idle=pool_size or 5)
        # A server's concurrent lookups, answered together (PostgreSQL; SQLite is read in place).
        self._best_many = RawQuery(self, _BEST_ROWS, max_idle=pool_size or 5) if self.dialect == "postgresql" else None
        self._coalesced = Coalesced(self._best_many, _ASKED_BY) if self._best_many is not None else None
        try:
            ensure_schema(self)
        except BaseException:
            self.close()
            raise

    @classmethod
    def upgrade(cls, url: str) -> str:
        """Apply the migrations up to head; returns the new revision."""
        return upgrade(url)

    def schema_revision(self) -> str | None:
        """The revision stamped in this store's database (readiness probes)."""
        return stamped_revision(self)

    def close(self) -> None:
        for query in (self._best_query, self._best_of_workload, self._best_many):
            if query is not None:
                query.close()
        super().close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

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

    def workload_directory(self, *, kernel: str | None = None, problem: str | None = None) -> list[tuple[str, str, str, str]]:
        """(kernel, source hash, canonical problem, device) of every workload (of ``kernel``
        at ``problem`` where given): what a server keeps in memory to answer lookups of
        absent keys without a query."""
        query = select(WorkloadModel.kernel, WorkloadModel.source_hash, WorkloadModel.problem, WorkloadModel.device).distinct()
        if kernel is not None:
            query = query.where(WorkloadModel.kernel == kernel)
        if problem is not None:
            query = query.where(WorkloadModel.problem == problem)
        try:
            with self.lookup_engine.connect() as connection:
                return [tuple(row) for row in connection.execute(query)]
        except DBAPIError as exc:
            raise self.error(exc) from None

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
            return [(row.id, workload_key(row)) for row in session.scalars(query)]

    # --- trials ---------------------------------------------------------------

    def commit_trial(self, *, workload_id: int, candidate: Candidate, result: TrialResult) -> StoredTrial:
        """Store ``result`` for ``candidate`` on the workload, committed before returning.

        One row per (workload, candidate): a later result replaces an earlier one,
        except that a BUILT result never replaces a final outcome (a runner's, or
        a build failure): re-building a resumed candidate must not erase its timing.
        Returns what is stored afterwards.
        """
        with self.transaction() as connection:
            stored = upsert_trial(connection, self.sql, workload_id=workload_id, candidate=candidate, result=result)
        if stored is None:  # a BUILT result refused: what is stored is the earlier outcome
            stored = self.get_trial(workload_id=workload_id, candidate_hash=candidate.hash)
            assert stored is not None
        return stored

    def commit_trials(self, *, workload_id: int, items: Sequence[tuple[Candidate, TrialResult]]) -> None:
        """Store several results on the workload in one transaction, by ``commit_trial``'s
        rules (a candidate given twice keeps its later result); nothing is read back."""
        with self.transaction() as connection:
            upsert_trials(connection, self.sql, workload_id=workload_id, items=items)

    def get_trial(self, *, workload_id: int, candidate_hash: str) -> StoredTrial | None:
        query = trials_query().where(TrialModel.workload_id == workload_id, CandidateModel.hash == candidate_hash)
        with self.session_scope(read_only=True) as session:
            row = session.execute(query).first()
            return stored_trial(*row) if row else None

    def trials_by_hash(self, *, workload_id: int) -> dict[str, StoredTrial]:
        """Every stored outcome of the workload by candidate hash (what a resumed run skips)."""
        with self.session_scope(read_only=True) as session:
            rows = session.execute(trials_query().where(TrialModel.workload_id == workload_id).order_by(TrialModel.id))
            return {cand.hash: stored_trial(trial, cand) for trial, cand in rows}

    def _fastest(self, query: Select[TrialModel, CandidateModel], k: int) -> list[StoredTrial]:
        if k <= 0:
            return []
        query = (
            query.where(TrialModel.status == Status.OK.value, TrialModel.median_ms.is_not(None))
            .order_by(*RANK_ORDER)
            .limit(k)
        )
        with self.session_scope(read_only=True) as session:
            return [stored_trial(trial, cand) for trial, cand in session.execute(query)]

    def top_k(self, *, workload_id: int, k: int = 10) -> list[StoredTrial]:
        """The ``k`` fastest correct (OK) trials of the workload, fastest first."""
        return self._fastest(trials_query().where(TrialModel.workload_id == workload_id), k)

    def top_compilable(self, *, workload_id: int, k: int) -> list[StoredTrial]:
        """The ``k`` fastest stored trials of the workload that compile to a tilelang kernel."""
        # One reference per workload at most, so k + 1 rows always hold k others.
        return [t for t in self.top_k(workload_id=workload_id, k=k + 1) if t.candidate.lowering is not Lowering.REFERENCE][:k]

    def best_compilable(self, *, workload_id: int) -> StoredTrial | None:
        """The fastest correct trial of the workload that tilelang can compile (not the
        vendor reference): ``top_k``'s answer for the in-process lookup's hot path, one
        prepared statement on the raw driver (bestread.py), a thirtieth of the ORM's cost."""
        if self._best_of_workload is None:  # a SQLite database in memory: the engine's one connection
            found = self.top_compilable(workload_id=workload_id, k=1)
            return found[0] if found else None
        rows = self._best_of_workload.all({"workload_id": workload_id})
        return _trial_of_row(rows[0]) if rows else None

    def best(self, *, key: WorkloadKey) -> StoredTrial | None:
        """The fastest correct trial of ``key``'s workload; None if it has none (or no workload)."""
        query = trials_query().join(WorkloadModel, TrialModel.workload_id == WorkloadModel.id)
        found = self._fastest(query.where(WorkloadModel.key_hash == key.hash), 1)
        return found[0] if found else None

    def best_stored(self, *, kernel: str, source_hash: str, problem: str, device: str) -> StoredBest | None:
        """The fastest correct compilable trial of one source of ``kernel`` at the canonical
        ``problem`` JSON on ``device``, on any toolchain; None if there is none. Its cost
        does not grow with the number of trials: each workload's best is its first
        entry in the rank index."""
        where = {"kernel": kernel, "source_hash": source_hash, "problem": problem, "device": device}
        try:
            with self.lookup_engine.connect() as connection:
                rows = connection.execute(_BEST_AT, where).all()
        except DBAPIError as exc:
            raise self.error(exc) from None
        if not rows:
            return None
        best = min(rows, key=_rank)
        return StoredBest(
            best.trial_id, utc(best.updated_at), best.median_ms, best.p20_ms, best.p80_ms, best.reps, best.tflops, best.gbps,
            best.candidate_hash, best.lowering, best.params, best.schedule, workload_key(best),
        )  # fmt: skip

    def best_stored_fast(self, *, kernel: str, source_hash: str, problem: str, device: str) -> StoredBest | None:
        """``best_stored``'s answer, for a server's hot path: the same statement run on
        the raw driver over connections of its own (bestread.py), about a third of
        the CPU. A SQLite database in memory has only the engine's one connection:
        ``best_stored`` answers there."""
        where = {"kernel": kernel, "source_hash": source_hash, "problem": problem, "device": device}
        query = self._best_query
        return self.best_stored(**where) if query is None else _stored_best(query.all(where))

    async def best_stored_async(self, *, kernel: str, source_hash: str, problem: str, device: str) -> StoredBest | None:
        """``best_stored_fast`` for a caller on an event loop: SQLite read in place,
        PostgreSQL with the lookups that arrive together in one statement (bestread.py)."""
        where = {"kernel": kernel, "source_hash": source_hash, "problem": problem, "device": device}
        if self._coalesced is not None:
            return _stored_best(await self._coalesced.all(where))
        query = self._best_query  # SQLite: one indexed read, in place (bestread.py)
        return self.best_stored(**where) if query is None else _stored_best(query.all(where))

    def status_counts(self, *, workload_id: int) -> dict[str, int]:
        """How many trials of the workload are in each status (status value -> count)."""
        query = (
            select(TrialModel.status, func.count())
            .where(TrialModel.workload_id == workload_id)
            .group_by(TrialModel.status)
        )
        with self.session_scope(read_only=True) as session:
            return {status: count for status, count in session.execute(query)}


class OnStore:
    """A layer of SQL over a store's database (the job queue's parts, the registry)."""

    def __init__(self, store: Store) -> None:
        self.store, self.sql = store, store.sql
