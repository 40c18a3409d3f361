"""stand aside: a worker that cannot run a run's problem says so and stops claiming that run

One row per worker process and run with the reason (the problem does not import on that node,
a dependency is missing, the device process dies loading it, the same error on every
configuration). The view ``standing_aside`` adds the worker's host, pid, device and state, for
people and for the reader role. A partial index on released attempts lets a worker ask whether
another one already handed a trial back for the same environment error.

Revision ID: 0004_stand_aside
Revises: 0002_worker_capacity
Create Date: 2026-12-01 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004_stand_aside"
down_revision = "0002_worker_capacity"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

#: Frozen copy of the view as this revision creates it (schema.VIEWS may move on).
STANDING_ASIDE = """
SELECT s.run_id,
       s.worker_id,
       w.host,
       w.pid,
       d.name AS device_name,
       w.state AS worker_state,
       w.heartbeat_at,
       s.reason,
       s.at
  FROM tunefleet.stand_aside s
  JOIN tunefleet.worker w ON w.id = s.worker_id
  LEFT JOIN tunefleet.device d ON d.id = w.device_id
"""


def upgrade() -> None:
    op.create_table(
        "stand_aside",
        sa.Column("worker_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(["worker_id"], ["tunefleet.worker.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["tunefleet.run.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("worker_id", "run_id"),
        schema=SCHEMA,
    )
    op.create_index("stand_aside_run_idx", "stand_aside", ["run_id"], schema=SCHEMA)
    op.create_index(
        "attempt_released_idx",
        "attempt",
        ["trial_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("outcome = 'released'"),
    )
    op.execute(f"CREATE VIEW {SCHEMA}.standing_aside AS {STANDING_ASIDE}")


def downgrade() -> None:
    op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.standing_aside")
    op.drop_index("attempt_released_idx", table_name="attempt", schema=SCHEMA)
    op.drop_index("stand_aside_run_idx", table_name="stand_aside", schema=SCHEMA)
    op.drop_table("stand_aside", schema=SCHEMA)
