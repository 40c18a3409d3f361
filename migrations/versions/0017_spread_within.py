"""spread_within: a run's tolerance also rests on how far one process's launches spread

Three processes of one kernel can agree within 1 % by luck while each one's launches spread
20 % (a CPU device beside other work: a process's median is where the shares of its speeds
put it), and the next process lands outside a ± estimated from their differences alone. The
confirmation now also takes the median noise (IQR over median) of the finalists' processes
and keeps the tolerance at least ``tunefleet.spread.WITHIN_FACTOR`` times it, and stores it:

- ``run.spread_within``: that median noise (NULL: not judged, or judged before this
  revision).

No view changes: the reports read it from ``run``.

Revision ID: 0017_spread_within
Revises: 0016_spread
Create Date: 2026-12-06 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017_spread_within"
down_revision = "0016_spread"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"


def upgrade() -> None:
    op.add_column(
        "run",
        sa.Column("spread_within", postgresql.DOUBLE_PRECISION(), nullable=True),
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_column("run", "spread_within", schema=SCHEMA)
