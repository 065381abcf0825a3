"""ws-tune 0.3.0: the trials' rank index in the exact order of RANK_ORDER.

Revision ID: v0.3.0.b
Revises: v0.3.0.a
Create Date: 2026-11-30

Results rank by ``confirmed DESC, ratio IS NULL, ratio, median_ms, id``
(repository.RANK_ORDER). The index of v0.3.0.a had ``confirmed`` ascending and
no ``ratio IS NULL`` or ``id``, so neither PostgreSQL nor SQLite could read a
workload's best trials in index order: every lookup sorted all of the
workload's trials. This index has the whole order (an expression index; both
databases have them), so the best trial is the first entry read.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "v0.3.0.b"
down_revision: str | Sequence[str] | None = "v0.3.0.a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_INDEX = "ix_ws_tune_trials_workload_status_rank"
NEW_INDEX = "ix_ws_tune_trials_workload_rank"


def upgrade() -> None:
    op.drop_index(OLD_INDEX, table_name="ws_tune_trials")
    op.execute(f"CREATE INDEX {NEW_INDEX} ON ws_tune_trials "
               "(workload_id, status, confirmed DESC, (ratio IS NULL), ratio, median_ms, id)")  # fmt: skip


def downgrade() -> None:
    op.drop_index(NEW_INDEX, table_name="ws_tune_trials")
    op.create_index(OLD_INDEX, "ws_tune_trials", ["workload_id", "status", "confirmed", "ratio", "median_ms"])
