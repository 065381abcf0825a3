"""What the API's routes share in one process: the store, the job queue, the
registry, and three small in-memory caches (token checks, registered kernels,
best-schedule answers), each with a short time to live so that several server
processes stay consistent within seconds."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from ..candidate import canonical_json
from ..schedule import Schedule
from ..store import Store, open_store
from ..store.queue import JobQueue, optuna_storage
from ..store.registry import KernelRecord, Registry
from ..store.repository import StoredBest
from ..workload import untimed_note
from . import kernels as kernel_files
from .batching import Batched
from .config import Settings
from .schemas import BestPublic
from .security import ADMIN, Principal, hash_token

_log = logging.getLogger(__name__)
V = TypeVar("V")


class TTLCache(Generic[V]):
    """A bounded dict whose entries expire; thread-safe (routes run in a thread pool)."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl, self.max_entries = ttl, max_entries
        self._data: dict[Any, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> V | None:
        entry = self._data.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: Any, value: V) -> V:
        if self.ttl <= 0:
            return value
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data.clear()  # crude but bounded: a flood of distinct keys cannot grow memory
            self._data[key] = (time.monotonic() + self.ttl, value)
        return value

    def peek(self, key: Any, max_stale: float) -> tuple[V, bool] | None:
        """(value, fresh) of an entry expired at most ``max_stale`` seconds ago."""
        entry = self._data.get(key)
        if entry is None:
            return None
        now = time.monotonic()
        if entry[0] + max_stale < now:
            return None
        return entry[1], entry[0] >= now

    def expires_within(self, key: Any, seconds: float) -> bool:
        """Whether ``key``'s entry is still fresh but expires within ``seconds``."""
        entry = self._data.get(key)
        return entry is not None and 0 <= entry[0] - time.monotonic() < seconds

    def get_or(self, key: Any, compute: Callable[[], V]) -> V:
        found = self.get(key)
        return found if found is not None else self.put(key, compute())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


@dataclass(frozen=True)
class CachedAnswer:
    status: int
    body: bytes
    etag: str | None = None


_MISSING = object()


class WorkloadDirectory:
    """Which workloads exist, (kernel, canonical problem) -> [(source hash, device)],
    from a snapshot at most ``ttl`` seconds old. A lookup of a key that has no
    workload at all is a miss answered without a query, and a miss's explanation
    comes from here too. A workload created meanwhile is seen within ``ttl``, as
    a remembered answer is."""

    def __init__(self, store: Store, ttl: float) -> None:
        self.store, self.ttl = store, ttl
        self._snapshot: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._taken_at = -math.inf
        self._lock = threading.Lock()

    def get(self, kernel: str, problem: str) -> list[tuple[str, str]]:
        if self.ttl <= 0:
            return [(source, device) for _, source, _, device in self.store.workload_directory(kernel=kernel, problem=problem)]
        if not self.fresh():
            self.refresh()
        return self._snapshot.get((kernel, problem), [])

    def fresh(self) -> bool:
        """Whether ``get`` answers from the snapshot without a query."""
        return self.ttl > 0 and time.monotonic() - self._taken_at <= self.ttl

    def aging(self) -> bool:
        """Whether the snapshot is fresh but in the second half of its time to live."""
        return self.fresh() and time.monotonic() - self._taken_at > self.ttl / 2

    def refresh(self, *, ahead: bool = False) -> None:
        """A new snapshot, unless another caller took one meanwhile (``ahead``: unless
        one was taken within the first half of the time to live)."""
        with self._lock:  # one refresh at a time; the others take its snapshot
            if time.monotonic() - self._taken_at > (self.ttl / 2 if ahead else self.ttl):
                taken_at = time.monotonic()
                snapshot: dict[tuple[str, str], list[tuple[str, str]]] = {}
                for k, source, p, device in self.store.workload_directory():
                    snapshot.setdefault((k, p), []).append((source, device))
                self._snapshot, self._taken_at = snapshot, taken_at


class Services:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings, self.store = settings, store
        self.queue = JobQueue(store, stalled_transaction_timeout=max(5.0, 4 * settings.grace))
        self.registry = Registry(store)
        self._auth: TTLCache[Any] = TTLCache(settings.auth_cache_ttl)
        self._kernels: TTLCache[Any] = TTLCache(5.0)
        self.best_cache: TTLCache[CachedAnswer] = TTLCache(settings.best_cache_ttl)
        self.workloads = WorkloadDirectory(store, settings.workload_directory_ttl)
        self._problems: dict[tuple[str, str, str | None], str | CachedAnswer] = {}  # see _canonical_problem
        self._raw_queries: dict[tuple[Any, ...], set[bytes]] = {}  # lookup key -> the query strings that asked it
        self._query_key: dict[bytes, tuple[Any, ...]] = {}  # and back
        self._refreshing: set[tuple[Any, ...]] = set()
        self._refresh_lock = threading.Lock()
        self._refresher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ws-tune-best")
        # Submissions run here rather than in the 40 threads of the request pool: on few
        # cores the GIL passed among dozens of runnable threads cost more than the insert.
        self.submitter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ws-tune-submit")
        self.new_jobs = Batched(self.queue.create_jobs, name="ws-tune-new-jobs")  # their INSERTs, together
        token = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
        self._bootstrap_hash = hash_token(token) if token else None
        self._optuna: Any = None  # Optuna's storage, for the sweeper
        self.checker = kernel_files.SyntaxChecker(
            settings.upload_check_workers, settings.upload_check_timeout, settings.upload_check_memory
        )

    @classmethod
    def open(cls, settings: Settings) -> "Services":
        # A connection for each route thread, the two refreshers and the sweeper: under
        # load none waits for a connection, and none is opened and closed per request.
        store = open_store(settings.db, timeouts=settings.db_timeouts, pool_size=settings.threads + 3)
        services = cls(settings, store)
        try:
            services.register_kernel_dirs()
        except BaseException:
            store.close()
            raise
        return services

    def close(self) -> None:
        self._refresher.shutdown(wait=True, cancel_futures=True)
        self.submitter.shutdown(wait=True, cancel_futures=True)
        self.new_jobs.close()
        self.checker.close()
        if self._optuna is not None:
            self._optuna.engine.dispose()
        self.store.close()

    def sweep(self) -> None:
        """Re-queue stale trials, close finished jobs, and fail the sampler trials that
        lost workers left running (Optuna's storage is opened once some job has one)."""
        settings = self.settings
        self.queue.sweep(grace=settings.grace, max_retry=settings.max_retry)
        jobs = self.queue.sampled_jobs()
        if jobs:
            if self._optuna is None:
                self._optuna = optuna_storage(self.store.url, timeouts=self.store.timeouts)
            self.queue.fail_orphan_trials(self._optuna, jobs, grace=settings.grace)

    # --- kernels ----------------------------------------------------------------
    def register_kernel_dirs(self) -> list[KernelRecord]:
        """Store each file of the kernel directories under its name (no import: the
        PROBLEM literals are read from the syntax tree)."""
        out = []
        for name, source, path in kernel_files.scan(self.settings.kernel_dirs):
            record = self.registry.put_kernel(name, source, registered=True, problem=kernel_files.problem_signature(source))
            _log.info("registered kernel %s (%s, sha256 %s)", name, path, record.sha256[:12])
            out.append(record)
        return out

    def registered_kernel(self, name: str) -> KernelRecord | None:
        found = self._kernels.get(name)
        if found is None:
            found = self._fetch_kernel(name)
        return None if found is _MISSING else found

    def _fetch_kernel(self, name: str) -> Any:
        return self._kernels.put(name, self.registry.registered_kernel(name) or _MISSING)

    # --- authentication ---------------------------------------------------------
    def authenticate(self, token: str) -> Principal | None:
        """The principal of a presented token, or None. Looked up by sha256; the
        token itself is never stored, cached or logged."""
        digest = hash_token(token)
        found = self._checked(digest)
        if found is None:
            found = self._recheck_token(digest)
        return None if found is _MISSING else found

    def known_principal(self, token: str | None) -> Principal | None:
        """The principal of a token found valid within the token cache's time to
        live, without a query; None for any other (``authenticate`` checks those).
        A token in use is checked again in the background in the second half of its
        time to live: under load its entry never lapses, which would send every
        request holding it through the full route at once (the p99 of authenticated
        reads), and a revoked token still lapses within the time to live."""
        if not token:
            return None
        digest = hash_token(token)
        found = self._checked(digest)
        if found is not None and found is not _MISSING and self._auth.expires_within(digest, self._auth.ttl / 2):
            self._in_background(("token", digest), lambda: self._recheck_token(digest))
        return None if found is _MISSING else found

    def _recheck_token(self, digest: str) -> Any:
        """Check a token's digest against the database and remember it: a principal, or _MISSING."""
        record = self.registry.token_by_hash(digest)
        return self._auth.put(digest, Principal(record.id, record.name, record.scopes) if record else _MISSING)

    def _checked(self, digest: str) -> Any:
        """The bootstrap principal, or a check of the token cache (a principal or
        _MISSING), or None when the token has not been checked within its TTL."""
        if self._bootstrap_hash is not None and secrets.compare_digest(digest, self._bootstrap_hash):
            return Principal(None, "bootstrap", (ADMIN,))
        return self._auth.get(digest)

    # --- best schedules ---------------------------------------------------------
    # Answers are kept as ready JSON bytes for best_cache_ttl seconds, and for up to
    # BEST_MAX_STALE seconds more while one background refresh per key is under way
    # (stale-while-revalidate): a lookup never waits on the database once warm, and a
    # burst of lookups at expiry does not become a burst of queries.
    BEST_MAX_STALE = 30.0

    def best_answer(self, kernel: str, problem: str, device: str, source_hash: str | None) -> CachedAnswer:
        key = (kernel, problem, device, source_hash)
        return self._remembered(key) or self._answer_and_remember(key)

    def _remembered(self, key: tuple[Any, ...]) -> CachedAnswer | None:
        """The remembered answer of ``key``, if any; a stale one is refreshed in the background."""
        entry = self.best_cache.peek(key, self.BEST_MAX_STALE)
        if entry is None:
            return None
        if not entry[1]:
            self.refresh_best(key)
        return entry[0]

    def remember_query(self, query: bytes, kernel: str, problem: str, device: str, source_hash: str | None, answer: CachedAnswer) -> None:
        """Let the fast path serve this exact query string (see middleware.BestLookupFastPath)."""
        key = (kernel, problem, device, source_hash)
        with self._refresh_lock:
            if len(self._query_key) > 10_000:
                self._raw_queries.clear()
                self._query_key.clear()
            self._raw_queries.setdefault(key, set()).add(query)
            self._query_key[query] = key
        self.best_cache.put(("raw", query), answer)

    def fast_answer(self, query: bytes) -> CachedAnswer | None:
        """The answer for a raw query string the route has answered before, if any."""
        entry = self.best_cache.peek(("raw", query), self.BEST_MAX_STALE)
        if entry is None:
            return None
        if not entry[1]:
            key = self._query_key.get(query)
            if key is None:
                return None
            self.refresh_best(key)
        return entry[0]

    def known_query(self, query: bytes) -> tuple[Any, ...] | None:
        """The lookup key of a raw query string the route has answered, if any."""
        return self._query_key.get(query)

    def refresh_best(self, key: tuple[Any, ...]) -> None:
        self._in_background(key, lambda: self._answer_and_remember(key))

    def _in_background(self, key: tuple[Any, ...], refresh: Callable[[], Any]) -> None:
        """Run ``refresh`` in the refresher's thread unless one for ``key`` is under way."""
        with self._refresh_lock:
            if key in self._refreshing:
                return
            self._refreshing.add(key)

        def run() -> None:
            try:
                refresh()
            except Exception as exc:  # noqa: BLE001 - a failed refresh leaves the remembered entry, until it expires
                _log.warning("a background refresh (%s) failed: %s", key[0], exc)
            finally:
                with self._refresh_lock:
                    self._refreshing.discard(key)

        try:
            self._refresher.submit(run)
        except RuntimeError:  # shutting down
            with self._refresh_lock:
                self._refreshing.discard(key)

    def _answer_and_remember(self, key: tuple[Any, ...]) -> CachedAnswer:
        return self._remember(key, self._lookup_best(*key))

    def _remember(self, key: tuple[Any, ...], answer: CachedAnswer) -> CachedAnswer:
        self.best_cache.put(key, answer)
        for query in list(self._raw_queries.get(key, ())):
            self.best_cache.put(("raw", query), answer)
        return answer

    def _canonical_problem(self, kernel: str, problem: str, registered: KernelRecord | None) -> str | CachedAnswer:
        """The canonical JSON of a problem as given (or a 422), remembered per spelling
        and registered source: parsing it took a seventh of an uncached lookup."""
        key = (kernel, problem, registered.sha256 if registered else None)
        found = self._problems.get(key)
        if found is None:
            try:
                full, _ = kernel_files.normalize_problem(kernel, problem, registered.problem if registered else None)
                found = canonical_json(full)
            except ValueError as exc:
                found = CachedAnswer(422, _error(str(exc)))
            if len(self._problems) >= 10_000:
                self._problems.clear()  # bounded: a flood of distinct spellings cannot grow memory
            self._problems[key] = found
        return found

    def _lookup_best(self, kernel: str, problem: str, device: str, source_hash: str | None) -> CachedAnswer:
        question = self._best_question(kernel, problem, device, source_hash, from_memory=False)
        assert question is not None
        if isinstance(question, CachedAnswer):
            return question
        return question.answer(self.store.best_stored_fast(**question.where) if question.where else None)

    async def best_answer_async(self, kernel: str, problem: str, device: str, source_hash: str | None) -> CachedAnswer:
        """``best_answer`` without the hop into the thread pool and back (which cost more
        CPU than the query) when everything but the best row is in memory, as it is under
        load: the kernel's registration, the canonical problem, the workload directory.
        Else in the thread pool, as before."""
        key = (kernel, problem, device, source_hash)
        remembered = self._remembered(key)
        if remembered is not None:
            return remembered
        self._refresh_ahead(kernel)
        # What memory lacks is fetched in a thread first (the directory every workload_directory_ttl,
        # the kernel's registration every 5 s), so that a lookup then goes on here.
        if self.workloads.ttl > 0 and not self.workloads.fresh():
            await run_in_threadpool(self.workloads.refresh)
        if self._kernels.get(kernel) is None:
            await run_in_threadpool(self.registered_kernel, kernel)
        question = self._best_question(kernel, problem, device, source_hash, from_memory=True)
        if question is None:  # still not in memory (expired meanwhile), or an unregistered kernel's sources
            return await run_in_threadpool(self._answer_and_remember, key)
        if isinstance(question, CachedAnswer):
            return self._remember(key, question)
        best = await self.store.best_stored_async(**question.where) if question.where else None
        return self._remember(key, question.answer(best))

    def _refresh_ahead(self, kernel: str) -> None:
        """The directory and the kernel's registration are fetched again in the background
        in the second half of their time to live: under load they never lapse. A lapse sent
        every lookup in flight to the thread pool at once (32 threads, 32 queries on two
        cores, every 5 s: the stalls of tens of ms that set the p99 of uncached lookups)."""
        if self.workloads.aging():
            self._in_background(("directory",), lambda: self.workloads.refresh(ahead=True))
        if self._kernels.expires_within(kernel, self._kernels.ttl / 2):
            self._in_background(("kernel", kernel), lambda: self._fetch_kernel(kernel))

    def _best_question(
        self, kernel: str, problem: str, device: str, source_hash: str | None, *, from_memory: bool
    ) -> CachedAnswer | _BestQuestion | None:
        """What a lookup asks the store (or its answer when memory has it: a 422, 404 or
        409). With ``from_memory``, None where finding out would take a query."""
        if from_memory:
            known = self._kernels.get(kernel)
            if known is None:
                return None
            registered = None if known is _MISSING else known
        else:
            registered = self.registered_kernel(kernel)
        problem_json = self._canonical_problem(kernel, problem, registered)
        if isinstance(problem_json, CachedAnswer):
            return problem_json
        if from_memory and not self.workloads.fresh():
            return None
        stored = self.workloads.get(kernel, problem_json)
        if not stored:  # known absent: nothing was ever tuned for this kernel and problem
            return CachedAnswer(404, _error(f"no timed result for {kernel} at {problem_json} on {device!r}"))
        # One source of the kernel, never a mix: the one asked for, else the registered
        # file's, else the only one that has results here.
        if source_hash is None and registered is not None:
            source_hash = registered.sha256
        if source_hash is None:
            if from_memory:
                return None
            sources = self.registry.timed_sources(kernel=kernel, problem=problem_json, device=device)
            if len(sources) > 1:
                return CachedAnswer(409, _error(f"results of several sources of {kernel} at {problem_json} on {device!r}; "
                                                "choose one with source_hash"))  # fmt: skip
            source_hash = sources[0] if sources else None
        return _BestQuestion(kernel, problem_json, device, source_hash, stored)


@dataclass(frozen=True)
class _BestQuestion:
    """A lookup resolved up to the store's query: its answer is found_answer of the best
    row, or a 404 that explains from the workload directory why there is none."""

    kernel: str
    problem_json: str
    device: str
    source_hash: str | None
    stored: list[tuple[str, str]]  # (source hash, device) of the workloads of (kernel, problem)

    @property
    def where(self) -> dict[str, str] | None:
        """best_stored's arguments; None when no source has results (nothing to ask)."""
        if self.source_hash is None:
            return None
        return {"kernel": self.kernel, "source_hash": self.source_hash, "problem": self.problem_json, "device": self.device}

    def answer(self, best: StoredBest | None) -> CachedAnswer:
        if best is not None:
            return found_answer(best)
        # e.g. only compile-only results (workers without a GPU time nothing), or another device's
        why = untimed_note(self.device, (d for s, d in self.stored if self.source_hash is None or s == self.source_hash))
        return CachedAnswer(404, _error(f"no timed result for {self.kernel} at {self.problem_json} on {self.device!r}{why}"))


@functools.lru_cache(maxsize=1024)
def found_answer(best: StoredBest) -> CachedAnswer:
    """The 200 answer for a stored best, remembered by the row's values: the answer is
    made of them alone, so a row read again unchanged needs no new JSON nor ETag
    (building them took a quarter of an uncached lookup). A changed row is another key."""
    # The ETag names the stored row's version: it changes when a faster trial
    # wins or this one is re-measured, whichever server process answers.
    tag = hashlib.sha256(f"{best.trial_id}:{best.updated_at.isoformat()}:{best.candidate_hash}".encode()).hexdigest()[:32]
    return CachedAnswer(200, best_json(best), f'"{tag}"')


def best_json(best: StoredBest) -> bytes:
    """BestPublic as JSON, from the stored row and canonical JSON: the candidate is
    not re-created, its hash not recomputed."""
    key = best.key
    schedule = json.loads(best.schedule_json) if best.schedule_json is not None else None
    public = BestPublic.model_construct(
        kernel=key.kernel, problem=json.loads(key.problem), device=key.device, source_hash=key.source_hash,
        workload={f.name: getattr(key, f.name) for f in dataclasses.fields(key)}, candidate_hash=best.candidate_hash,
        candidate={"lowering": best.lowering, "params": json.loads(best.params_json), "schedule": schedule},
        lowering=best.lowering, median_ms=best.median_ms, p20_ms=best.p20_ms, p80_ms=best.p80_ms, reps=best.reps,
        tflops=best.tflops, gbps=best.gbps, tilelang=_tilelang(best.schedule_json) if best.schedule_json is not None else None,
        updated_at=best.updated_at,
    )  # fmt: skip
    return BestPublic.__pydantic_serializer__.to_json(public)


@functools.lru_cache(maxsize=4096)
def _tilelang(schedule_json: str) -> str:
    """A schedule's TileLang code, by its canonical JSON (a stored schedule never changes)."""
    return Schedule.from_json(json.loads(schedule_json)).to_source()


def _error(detail: str) -> bytes:
    return json.dumps({"detail": detail}).encode()
