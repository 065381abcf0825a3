"""SQLAlchemy tables of the ws-tune store: one table per concept.

Tables come from the Alembic migrations in ``ws_tuner/migrations``, never from
``Base.metadata.create_all``: the migrations are the schema's history, and a
database built any other way has no revision to check against. Anyone adding a
table (jobs, tokens, ...) adds its model here, named with TABLE_PREFIX, *and* a
new migration revision.

JSON payloads are stored as canonical JSON *text* rather than a JSON column:
the canonical text is what ws-tune hashes, and PostgreSQL's JSON/JSONB would
reorder or reformat it, so a read-back could no longer be checked against the
stored hash. Text also reads back identically on SQLite and PostgreSQL.

Only ``repository.py`` queries these models.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Hex digests are at most 64 chars (sha256); today's hashes are truncated to 20
# (candidates) and 24 (workloads), and the column keeps room for a full digest.
MAX_HASH_LENGTH = 64
MAX_NAME_LENGTH = 256  # kernel names, device names, version strings
MAX_ARCH_LENGTH = 32  # "sm_90a"
MAX_ENUM_LENGTH = 32  # Status and Lowering values

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
        # Serves top_k / best: WHERE workload_id = ? AND status = 'ok' ORDER BY median_ms.
        Index("ix_ws_tune_trials_workload_status_median", "workload_id", "status", "median_ms"),
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
    info: Mapped[str] = mapped_column(Text, nullable=False, default="{}")  # JSON object: clocks, max error, ...
    created_at: Mapped[datetime] = _created_at()
    # Set explicitly by the upsert (ORM onupdate hooks do not fire for ON CONFLICT).
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()
    )
