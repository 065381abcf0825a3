"""ws-tune 0.1.0: ws_tune_workloads, ws_tune_candidates, ws_tune_trials.

Revision ID: v0.1.0.a
Revises:
Create Date: 2026-08-01

Written by hand and frozen: later schema changes go in new revisions, never
here, because databases already stamped v0.1.0.a will not re-run it. Lengths
are literals rather than the models' constants for the same reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "v0.1.0.a"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created_at(name: str = "created_at") -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "ws_tune_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("kernel", sa.String(256), nullable=False),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column("arch", sa.String(32), nullable=False),
        sa.Column("device", sa.String(256), nullable=False),
        sa.Column("tilelang_version", sa.String(256), nullable=False),
        sa.Column("cuda_version", sa.String(256), nullable=False),
        sa.Column("driver_version", sa.String(256), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_workloads"),
        sa.UniqueConstraint("key_hash", name="uq_ws_tune_workloads_key_hash"),
    )
    op.create_index("ix_ws_tune_workloads_kernel", "ws_tune_workloads", ["kernel"])

    op.create_table(
        "ws_tune_candidates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("lowering", sa.String(32), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("schedule", sa.Text(), nullable=True),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_candidates"),
        sa.UniqueConstraint("hash", name="uq_ws_tune_candidates_hash"),
    )

    op.create_table(
        "ws_tune_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p20_ms", sa.Float(), nullable=True),
        sa.Column("p80_ms", sa.Float(), nullable=True),
        sa.Column("reps", sa.Integer(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("info", sa.Text(), nullable=False),
        _created_at(),
        _created_at("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ws_tune_trials"),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["ws_tune_workloads.id"],
            name="fk_ws_tune_trials_workload_id_ws_tune_workloads",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["ws_tune_candidates.id"], name="fk_ws_tune_trials_candidate_id_ws_tune_candidates"
        ),
        sa.UniqueConstraint("workload_id", "candidate_id", name="uq_ws_tune_trials_workload_candidate"),
    )
    op.create_index(
        "ix_ws_tune_trials_workload_status_median", "ws_tune_trials", ["workload_id", "status", "median_ms"]
    )


def downgrade() -> None:
    # Children first; only ws-tune's own tables are dropped.
    op.drop_index("ix_ws_tune_trials_workload_status_median", table_name="ws_tune_trials")
    op.drop_table("ws_tune_trials")
    op.drop_table("ws_tune_candidates")
    op.drop_index("ix_ws_tune_workloads_kernel", table_name="ws_tune_workloads")
    op.drop_table("ws_tune_workloads")
