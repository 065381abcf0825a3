"""SQLAlchemy tables of the ws-tune store: one table per concept.

Tables come from the Alembic migrations in ``migrations/`` (installed as ``ws_tuner.migrations``), never from
``Base.metadata.create_all``: the migrations are the schema's history, and a
database built any other way has no revision to check against. Anyone adding a
table (jobs, tokens, ...) adds its model here, named with TABLE_PREFIX, *and* a
new migration revision.

JSON payloads are stored as canonical JSON *text* rather than a JSON column:
the canonical text is what ws-tune hashes, and PostgreSQL's JSON/JSONB would
reorder or reformat it, so a read-back could no longer be checked against the
stored hash. Text also reads back identically on SQLite and PostgreSQL.

Only the store package (its layers: see its ``__init__``)
queries these models.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, false, func, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Hex digests are at most 64 chars (sha256); today's hashes are truncated to 20
# (candidates) and 24 (workloads), and the column keeps room for a full digest.
MAX_HASH_LENGTH = 64
MAX_NAME_LENGTH = 256  # kernel names, device names, version strings
MAX_ARCH_LENGTH = 32  # "sm_90a"
MAX_ENUM_LENGTH = 32  # Status and Lowering values
MAX_SCOPES_LENGTH = 256  # space-separated token scopes
MAX_WORKER_ID_LENGTH = 64  # uuid4 hex, with room to spare

# Alembic's default version table is "alembic_version", which Optuna's RDBStorage
# also uses; both tools may share one database, so ws-tune keeps its own.
VERSION_TABLE = "ws_tune_alembic_version"
# Every table ws-tune owns carries this prefix. Optuna's RDBStorage, which may
# share the database (search/optuna.py), owns a table called plain "trials".
TABLE_PREFIX = "ws_tune_"


# Every constraint gets a deterministic name: Alembic's SQLite batch mode can only
# drop or alter a constraint it can name, and both dialects then agree on names.
NAMING_CONVENTION = {
    "pk": "pk_%(table_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _created_at() -> Mapped[datetime]:
    # Stamped by the database clock, not the worker's: workers on several hosts
    # then agree on the order of events.
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class WorkloadModel(Base):
    """Everything a result depends on (a ``WorkloadKey``); results are comparable
    only within one workload."""

    __tablename__ = TABLE_PREFIX + "workloads"
    # key_hash is derived from all the other columns; its uniqueness is what makes
    # get-or-create race-safe (the loser of a race gets IntegrityError and re-reads).
    __table_args__ = (UniqueConstraint("key_hash", name="uq_ws_tune_workloads_key_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(MAX_HASH_LENGTH), nullable=False)
    kernel: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False, index=True)
    source_hash: Mapped[str] = mapped_column(String(MAX_HASH_LENGTH), nullable=False)
    problem: Mapped[str] = mapped_column(Text, nullable=False)  # canonical JSON of the problem arguments
    arch: Mapped[str] = mapped_column(String(MAX_ARCH_LENGTH), nullable=False)
    device: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    tilelang_version: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    cuda_version: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    driver_version: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    created_at: Mapped[datetime] = _created_at()


class CandidateModel(Base):
    """One point of a search space, shared by every workload that tries it."""

    __tablename__ = TABLE_PREFIX + "candidates"
    __table_args__ = (UniqueConstraint("hash", name="uq_ws_tune_candidates_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(MAX_HASH_LENGTH), nullable=False)
    lowering: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)
    params: Mapped[str] = mapped_column(Text, nullable=False)  # canonical JSON object
    schedule: Mapped[str | None] = mapped_column(Text, nullable=True)  # canonical JSON; None for baseline lowerings
    created_at: Mapped[datetime] = _created_at()


class TrialModel(Base):
    """The outcome of one candidate on one workload. Failures are rows too (with
    a status and no timing), so a resumed run does not rebuild what already failed."""

    __tablename__ = TABLE_PREFIX + "trials"
    __table_args__ = (
        # One result per candidate per workload: re-measuring overwrites (upsert),
        # so N workers finishing N trials leave exactly N rows.
        UniqueConstraint("workload_id", "candidate_id", name="uq_ws_tune_trials_workload_candidate"),
        # Serves top_k / best in index order: WHERE workload_id = ? AND status = 'ok'
        # ORDER BY repository.RANK_ORDER, column for column (migration v0.3.0.b).
        Index("ix_ws_tune_trials_workload_rank", "workload_id", "status", text("confirmed DESC"), text("(ratio IS NULL)"),
              "ratio", "median_ms", "id"),  # fmt: skip
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(
        ForeignKey(TABLE_PREFIX + "workloads.id", ondelete="CASCADE"), nullable=False
    )
    candidate_id: Mapped[int] = mapped_column(ForeignKey(TABLE_PREFIX + "candidates.id"), nullable=False)
    # A plain string, not a DB enum or CHECK: adding a Status value then needs no migration.
    status: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False, default="")
    build_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # All four timing columns are set together (a Timing) or all NULL.
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p20_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p80_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    reps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Where the kernel file says what a call moves (bytes_moved): the server never imports it (v0.3.0.c).
    gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Time over the anchor's, side by side in one clock state: what ranks results (v0.3.0.a).
    ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    confirmed: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    info: Mapped[str] = mapped_column(Text, nullable=False, default="{}")  # JSON object: clocks, power, anchor, max error, ...
    created_at: Mapped[datetime] = _created_at()
    # Set explicitly by the upsert (ORM onupdate hooks do not fire for ON CONFLICT).
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()
    )


# --- the service (v0.2.0.a): kernels, tokens, jobs, job trials, workers ---------


class KernelModel(Base):
    """Kernel source, content-addressed by sha256: files registered from the
    server's kernel directories and sources uploaded over the API. Workers on
    any host read the source from here; the API server only stores it."""

    __tablename__ = TABLE_PREFIX + "kernels"
    __table_args__ = (UniqueConstraint("sha256", name="uq_ws_tune_kernels_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(MAX_HASH_LENGTH), nullable=False)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False, index=True)  # the file stem
    source: Mapped[str] = mapped_column(Text, nullable=False)
    size_bytes: Mapped[int] = mapped_column(Integer, nullable=False)
    # Canonical JSON {"defaults": PROBLEM, "choices": CHOICES} read from a registered
    # file's literals (never by importing it); NULL for uploads, which are not parsed.
    problem: Mapped[str | None] = mapped_column(Text, nullable=True)
    registered: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    registered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = _created_at()


class TokenModel(Base):
    """API tokens. Only the sha256 of a token is stored; the token itself is
    printed once, when it is created."""

    __tablename__ = TABLE_PREFIX + "tokens"
    __table_args__ = (UniqueConstraint("token_hash", name="uq_ws_tune_tokens_token_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(MAX_HASH_LENGTH), nullable=False)
    prefix: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)  # shown in listings
    scopes: Mapped[str] = mapped_column(String(MAX_SCOPES_LENGTH), nullable=False)  # space-separated
    created_at: Mapped[datetime] = _created_at()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class JobModel(Base):
    """A tuning job: one kernel at one problem, a budget of search trials.

    Workers share a job: each search trial is a *slot* claimed atomically
    (``slots_claimed < budget``), so however many workers join, the job never
    measures more than ``budget`` search candidates."""

    __tablename__ = TABLE_PREFIX + "jobs"
    __table_args__ = (Index("ix_ws_tune_jobs_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)  # queued/running/succeeded/failed/cancelled
    kernel_id: Mapped[int] = mapped_column(ForeignKey(TABLE_PREFIX + "kernels.id"), nullable=False)
    kernel: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    problem: Mapped[str] = mapped_column(Text, nullable=False)  # canonical JSON, full when problem_checked
    problem_checked: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    params: Mapped[str | None] = mapped_column(Text, nullable=True)  # pinned kernel parameters, "k=v,..."
    strategy: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)
    seed: Mapped[int] = mapped_column(Integer, nullable=False)
    budget: Mapped[int] = mapped_column(Integer, nullable=False)
    time_budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    baselines: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    # Pinned by the first worker that starts the job: one job is one workload.
    device: Mapped[str | None] = mapped_column(String(MAX_NAME_LENGTH), nullable=True)
    workload_id: Mapped[int | None] = mapped_column(
        ForeignKey(TABLE_PREFIX + "workloads.id", ondelete="SET NULL"), nullable=True
    )
    slots_claimed: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    exhausted: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())  # the space ran dry
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_by: Mapped[int | None] = mapped_column(
        ForeignKey(TABLE_PREFIX + "tokens.id", ondelete="SET NULL"), nullable=True
    )
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class JobTrialModel(Base):
    """One slot of a job: a search trial (``slot`` = 0..budget-1) or a baseline
    (``slot`` NULL), leased to one worker at a time.

    A RUNNING slot has an owner, a heartbeat (DB clock) and an ``epoch``, the
    fencing token: every hand-over (expiry, hand-back) bumps it, and a result is
    accepted only with the epoch it was claimed under, so a worker that lost its
    lease cannot record a late result. The measured outcome itself goes to
    ``ws_tune_trials`` in the same transaction."""

    __tablename__ = TABLE_PREFIX + "job_trials"
    __table_args__ = (
        UniqueConstraint("job_id", "slot", name="uq_ws_tune_job_trials_job_slot"),
        # One candidate per job: two workers proposing the same point cannot both measure it.
        UniqueConstraint("job_id", "candidate_hash", name="uq_ws_tune_job_trials_job_candidate"),
        Index("ix_ws_tune_job_trials_job_state", "job_id", "state"),
        Index("ix_ws_tune_job_trials_state_heartbeat", "state", "heartbeat_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey(TABLE_PREFIX + "jobs.id", ondelete="CASCADE"), nullable=False)
    slot: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kind: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)  # search/baseline
    state: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)  # queued/running/done/failed/cancelled
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    epoch: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    worker_id: Mapped[str | None] = mapped_column(String(MAX_WORKER_ID_LENGTH), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    candidate_hash: Mapped[str | None] = mapped_column(String(MAX_HASH_LENGTH), nullable=True)
    candidate: Mapped[str | None] = mapped_column(Text, nullable=True)  # canonical JSON, for retries on any worker
    decisions: Mapped[str | None] = mapped_column(Text, nullable=True)  # the sampler's view (JSON)
    optuna_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)  # trial number in the job's study
    workload_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str | None] = mapped_column(String(MAX_ENUM_LENGTH), nullable=True)  # a result.Status value
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    gbps: Mapped[float | None] = mapped_column(Float, nullable=True)  # as the trial's (v0.3.0.c)
    ratio: Mapped[float | None] = mapped_column(Float, nullable=True)  # as the trial's (v0.3.0.a)
    created_at: Mapped[datetime] = _created_at()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class WorkerModel(Base):
    """A worker process, for listings and readiness; its liveness is its heartbeat."""

    __tablename__ = TABLE_PREFIX + "workers"

    id: Mapped[str] = mapped_column(String(MAX_WORKER_ID_LENGTH), primary_key=True)
    host: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    gpu: Mapped[int | None] = mapped_column(Integer, nullable=True)
    device: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), nullable=False)
    state: Mapped[str] = mapped_column(String(MAX_ENUM_LENGTH), nullable=False)  # running/draining/stopped/lost
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[datetime] = _created_at()
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
