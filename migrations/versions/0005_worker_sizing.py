"""worker sizing: the code-generation processes and prefetch a worker chose, and how busy its
device was

A worker sizes its code-generation pool and prefetch itself (``worker.sizing``) and reports
them with the share of the time its device was busy, so ``tunefleet status`` shows them; its
``capacity`` (1 + prefetch) now changes while it runs, and the coordinator's queue follows it.
Rows written before this revision have no sizing (NULL).

Revision ID: 0005_worker_sizing
Revises: 0004_stand_aside
Create Date: 2026-12-01 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005_worker_sizing"
down_revision = "0004_stand_aside"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

CHECKS = {
    "worker_prepare_workers_valid": "prepare_workers IS NULL OR prepare_workers >= 0",
    "worker_prefetch_valid": "prefetch IS NULL OR prefetch >= 0",
    "worker_sizing_valid": "sizing IS NULL OR sizing IN ('auto', 'flags', 'mixed')",
    "worker_device_busy_valid": "device_busy IS NULL OR (device_busy >= 0 AND device_busy <= 1)",
}


def upgrade() -> None:
    op.add_column(
        "worker", sa.Column("prepare_workers", sa.Integer(), nullable=True), schema=SCHEMA
    )
    op.add_column("worker", sa.Column("prefetch", sa.Integer(), nullable=True), schema=SCHEMA)
    op.add_column("worker", sa.Column("sizing", sa.Text(), nullable=True), schema=SCHEMA)
    op.add_column(
        "worker",
        sa.Column("device_busy", postgresql.DOUBLE_PRECISION(), nullable=True),
        schema=SCHEMA,
    )
    for name, condition in CHECKS.items():
        op.create_check_constraint(name, "worker", condition, schema=SCHEMA)


def downgrade() -> None:
    for name in CHECKS:
        op.drop_constraint(name, "worker", schema=SCHEMA, type_="check")
    for column in ("device_busy", "sizing", "prefetch", "prepare_workers"):
        op.drop_column("worker", column, schema=SCHEMA)
