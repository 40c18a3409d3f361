"""worker capacity: how many trials a worker holds at once (1 + prefetch)

The coordinator keeps at least the live workers' summed capacity queued, so a worker started
with a deep ``--prefetch`` finds trials to prepare ahead. Rows written before this revision
get 2, the capacity of a worker with the default prefetch.

Revision ID: 0002_worker_capacity
Revises: 0001_initial
Create Date: 2026-12-01 04:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_worker_capacity"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"


def upgrade() -> None:
    op.add_column(
        "worker",
        sa.Column("capacity", sa.Integer(), server_default=sa.text("2"), nullable=False),
        schema=SCHEMA,
    )
    op.create_check_constraint("worker_capacity_positive", "worker", "capacity > 0", schema=SCHEMA)


def downgrade() -> None:
    op.drop_constraint("worker_capacity_positive", "worker", schema=SCHEMA, type_="check")
    op.drop_column("worker", "capacity", schema=SCHEMA)
