"""ws-tune 0.2.0: the tuning service: kernels, tokens, jobs, job trials, workers.

Revision ID: v0.2.0.a
Revises: v0.1.0.a
Create Date: 2026-08-15

Written by hand and frozen, like v0.1.0.a: later changes go in new revisions.
Only new tables: the 0.1.0 tables and their rows are untouched, and so is
anything else in the database (Optuna's tables in particular).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "v0.2.0.a"
down_revision: str | Sequence[str] | None = "v0.1.0.a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _now(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def _when(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)


def upgrade() -> None:
    op.create_table(
        "ws_tune_kernels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=True),
        sa.Column("registered", sa.Boolean(), nullable=False, server_default=sa.false()),
        _when("registered_at"),
        _now("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_kernels"),
        sa.UniqueConstraint("sha256", name="uq_ws_tune_kernels_sha256"),
    )
    op.create_index("ix_ws_tune_kernels_name", "ws_tune_kernels", ["name"])

    op.create_table(
        "ws_tune_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("scopes", sa.String(256), nullable=False),
        _now("created_at"),
        _when("revoked_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_ws_tune_tokens_token_hash"),
    )

    op.create_table(
        "ws_tune_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(256), nullable=False),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column("problem_checked", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("params", sa.Text(), nullable=True),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("time_budget", sa.Float(), nullable=True),
        sa.Column("baselines", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("device", sa.String(256), nullable=True),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("slots_claimed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("exhausted", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=True),
        _now("created_at"),
        _now("updated_at"),
        _when("started_at"),
        _when("finished_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_jobs"),
        sa.ForeignKeyConstraint(["kernel_id"], ["ws_tune_kernels.id"], name="fk_ws_tune_jobs_kernel_id_ws_tune_kernels"),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["ws_tune_workloads.id"],
            name="fk_ws_tune_jobs_workload_id_ws_tune_workloads",
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["created_by"], ["ws_tune_tokens.id"], name="fk_ws_tune_jobs_created_by_ws_tune_tokens", ondelete="SET NULL"
        ),
    )
    op.create_index("ix_ws_tune_jobs_state_id", "ws_tune_jobs", ["state", "id"])

    op.create_table(
        "ws_tune_job_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("epoch", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("worker_id", sa.String(64), nullable=True),
        _when("heartbeat_at"),
        sa.Column("candidate_hash", sa.String(64), nullable=True),
        sa.Column("candidate", sa.Text(), nullable=True),
        sa.Column("decisions", sa.Text(), nullable=True),
        sa.Column("optuna_trial", sa.Integer(), nullable=True),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        _now("created_at"),
        _when("finished_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_job_trials"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["ws_tune_jobs.id"], name="fk_ws_tune_job_trials_job_id_ws_tune_jobs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("job_id", "slot", name="uq_ws_tune_job_trials_job_slot"),
        sa.UniqueConstraint("job_id", "candidate_hash", name="uq_ws_tune_job_trials_job_candidate"),
    )
    op.create_index("ix_ws_tune_job_trials_job_state", "ws_tune_job_trials", ["job_id", "state"])
    op.create_index("ix_ws_tune_job_trials_state_heartbeat", "ws_tune_job_trials", ["state", "heartbeat_at"])

    op.create_table(
        "ws_tune_workers",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("device", sa.String(256), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        _now("started_at"),
        _now("heartbeat_at"),
        _when("stopped_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_workers"),
    )


def downgrade() -> None:
    # Children first; only the tables this revision created are dropped.
    op.drop_table("ws_tune_workers")
    op.drop_index("ix_ws_tune_job_trials_state_heartbeat", table_name="ws_tune_job_trials")
    op.drop_index("ix_ws_tune_job_trials_job_state", table_name="ws_tune_job_trials")
    op.drop_table("ws_tune_job_trials")
    op.drop_index("ix_ws_tune_jobs_state_id", table_name="ws_tune_jobs")
    op.drop_table("ws_tune_jobs")
    op.drop_table("ws_tune_tokens")
    op.drop_index("ix_ws_tune_kernels_name", table_name="ws_tune_kernels")
    op.drop_table("ws_tune_kernels")
