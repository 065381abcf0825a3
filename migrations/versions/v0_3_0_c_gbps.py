"""ws-tune 0.3.0: GB/s stored beside TFLOP/s.

Revision ID: v0.3.0.c
Revises: v0.3.0.b
Create Date: 2026-12-06

A memory-bound kernel is judged by GB/s, which only its kernel file can give
(``bytes_moved``): the command line computed it from the file, but the server
never imports kernel files, so the API and the dashboard had TFLOP/s only. The
worker that times a trial now stores its GB/s (``gbps``, on trials and on job
trials, for a job's listing). NULL where the file does not say what a call
moves, and on every row of before this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "v0.3.0.c"
down_revision: str | Sequence[str] | None = "v0.3.0.b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("ws_tune_trials", "ws_tune_job_trials")
RANK_INDEX = "ix_ws_tune_trials_workload_rank"  # v0.3.0.b's


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("gbps", sa.Float(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column by copying the table, and the copy loses the rank index (an
    # expression index, which SQLAlchemy does not reflect): it is dropped and made again.
    op.drop_index(RANK_INDEX, table_name="ws_tune_trials")
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("gbps")
    op.execute(f"CREATE INDEX {RANK_INDEX} ON ws_tune_trials "
               "(workload_id, status, confirmed DESC, (ratio IS NULL), ratio, median_ms, id)")  # fmt: skip
