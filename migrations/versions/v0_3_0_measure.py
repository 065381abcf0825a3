"""ws-tune 0.3.0: trials ranked by their ratio to an anchor timed side by side.

Revision ID: v0.3.0.a
Revises: v0.2.0.a
Create Date: 2026-11-30

Two columns on trials (and ``ratio`` on job trials, for a job's best): ``ratio`` (the trial's time over its anchor's, measured
in one clock state; NULL for rows of 0.2.0 and for untimed outcomes) and
``confirmed`` (re-timed in the final tournament). Results rank by confirmed
first, then ratio, then time; the index serves that order per workload.
Existing rows keep their values: they rank after any ratio, by time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "v0.3.0.a"
down_revision: str | Sequence[str] | None = "v0.2.0.a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_INDEX = "ix_ws_tune_trials_workload_status_median"
NEW_INDEX = "ix_ws_tune_trials_workload_status_rank"


def upgrade() -> None:
    with op.batch_alter_table("ws_tune_trials") as batch:
        batch.add_column(sa.Column("ratio", sa.Float(), nullable=True))
        batch.add_column(sa.Column("confirmed", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.drop_index(OLD_INDEX)
        batch.create_index(NEW_INDEX, ["workload_id", "status", "confirmed", "ratio", "median_ms"])
    with op.batch_alter_table("ws_tune_job_trials") as batch:
        batch.add_column(sa.Column("ratio", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ws_tune_job_trials") as batch:
        batch.drop_column("ratio")
    with op.batch_alter_table("ws_tune_trials") as batch:
        batch.drop_index(NEW_INDEX)
        batch.create_index(OLD_INDEX, ["workload_id", "status", "median_ms"])
        batch.drop_column("confirmed")
        batch.drop_column("ratio")
