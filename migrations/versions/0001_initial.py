"""initial: runs, trials, attempts, measurements, workers, devices and the views

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30 03:26:37.583549
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


# Frozen copies of the view definitions at this revision (later revisions replace them).
VIEWS = {
    "results": """
SELECT t.run_id,
       t.id AS trial_id,
       r.name AS run_name,
       r.problem,
       r.problem_args,
       r.device_class,
       t.config,
       t.config_hash,
       t.state,
       t.source,
       t.attempt,
       t.error,
       m.median_s,
       m.min_s,
       m.gflops,
       m.gbps,
       m.compile_s,
       d.name AS device_name,
       d.driver_version,
       w.host AS worker_host,
       t.lease_owner AS worker_id,
       t.started_at,
       t.finished_at
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = t.lease_owner
 WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out')
""",
    "best_per_run": """
SELECT DISTINCT ON (t.run_id)
       t.run_id,
       r.problem,
       r.problem_args,
       r.device_class,
       t.id AS trial_id,
       t.config,
       m.median_s,
       m.min_s,
       m.gflops,
       m.gbps,
       d.name AS device_name
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
 WHERE t.state = 'done'
 ORDER BY t.run_id, m.median_s, t.id
""",
    "best_per_problem_device": """
SELECT DISTINCT ON (m.problem, m.problem_args, d.device_class)
       m.problem,
       m.problem_args,
       d.device_class,
       d.name AS device_name,
       m.config,
       m.median_s,
       m.min_s,
       m.gflops,
       m.gbps,
       m.run_id,
       m.trial_id,
       m.created_at
  FROM tunefleet.measurement m
  JOIN tunefleet.device d ON d.id = m.device_id
 ORDER BY m.problem, m.problem_args, d.device_class, m.median_s, m.id
""",
    "run_progress": """
SELECT r.id AS run_id,
       r.name,
       r.problem,
       r.device_class,
       r.state AS run_state,
       r.stop_reason,
       count(t.id) AS trials,
       count(t.id) FILTER (WHERE t.state = 'pending') AS pending,
       count(t.id) FILTER (WHERE t.state = 'running') AS running,
       count(t.id) FILTER (WHERE t.state = 'done') AS done,
       count(t.id) FILTER (WHERE t.state = 'invalid') AS invalid,
       count(t.id) FILTER (WHERE t.state = 'failed') AS failed,
       count(t.id) FILTER (WHERE t.state = 'timed_out') AS timed_out,
       count(t.id) FILTER (WHERE t.state = 'cancelled') AS cancelled,
       count(t.id) FILTER (WHERE t.source = 'cache') AS cached,
       max(m.gflops) AS best_gflops,
       min(m.median_s) AS best_median_s,
       r.created_at,
       coalesce(r.finished_at, now()) - r.created_at AS elapsed,
       count(t.id) FILTER (WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out'))
         / greatest(extract(epoch FROM coalesce(r.finished_at, now()) - r.created_at) / 60.0,
                    1e-9) AS evaluations_per_minute
  FROM tunefleet.run r
  LEFT JOIN tunefleet.trial t ON t.run_id = r.id
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
 GROUP BY r.id
""",
}


def upgrade() -> None:
    op.create_table(
        "device",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=False),
        sa.Column("platform", sa.Text(), nullable=False),
        sa.Column("vendor", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("driver_version", sa.Text(), nullable=False),
        sa.Column("compute_units", sa.Integer(), nullable=True),
        sa.Column("global_mem_bytes", sa.BigInteger(), nullable=True),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
        schema="tunefleet",
    )
    op.create_table(
        "run",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column(
            "problem_args",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("space", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=False),
        sa.Column(
            "protocol",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("cache_key", sa.Text(), nullable=False),
        sa.Column(
            "search",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("max_trials", sa.Integer(), nullable=True),
        sa.Column("max_seconds", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column("target_gflops", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column("patience", sa.Integer(), nullable=True),
        sa.Column("state", sa.Text(), server_default=sa.text("'running'"), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("coordinator_id", sa.UUID(), nullable=True),
        sa.Column("coordinator_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('running', 'finished', 'stopped')", name="run_state_valid"),
        sa.CheckConstraint(
            "max_seconds IS NULL OR max_seconds > 0", name="run_max_seconds_positive"
        ),
        sa.CheckConstraint("max_trials IS NULL OR max_trials > 0", name="run_max_trials_positive"),
        sa.CheckConstraint("patience IS NULL OR patience > 0", name="run_patience_positive"),
        sa.PrimaryKeyConstraint("id"),
        schema="tunefleet",
    )
    op.create_index("run_cache_key_idx", "run", ["cache_key"], unique=False, schema="tunefleet")
    op.create_table(
        "worker",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.BigInteger(), nullable=True),
        sa.Column("device_class", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'active'"), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('active', 'stopped')", name="worker_state_valid"),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["tunefleet.device.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        schema="tunefleet",
    )
    op.create_index(
        "worker_active_idx",
        "worker",
        ["device_class", "heartbeat_at"],
        unique=False,
        schema="tunefleet",
        postgresql_where=sa.text("state = 'active'"),
    )
    op.create_table(
        "trial",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("config_hash", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("timeout_s", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column("source", sa.Text(), server_default=sa.text("'search'"), nullable=False),
        sa.Column("lease_owner", sa.UUID(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reported", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("source IN ('search', 'seed', 'cache')", name="trial_source_valid"),
        sa.CheckConstraint(
            "state <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="trial_running_has_lease",
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'invalid', 'failed', 'timed_out', 'cancelled')",
            name="trial_state_valid",
        ),
        sa.CheckConstraint("attempt >= 0 AND max_attempts > 0", name="trial_attempts_valid"),
        sa.ForeignKeyConstraint(
            ["lease_owner"],
            ["tunefleet.worker.id"],
        ),
        sa.ForeignKeyConstraint(["run_id"], ["tunefleet.run.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "config_hash", name="trial_run_config_unique"),
        schema="tunefleet",
    )
    op.create_index(
        "trial_claim_idx",
        "trial",
        ["device_class", "priority", "id"],
        unique=False,
        schema="tunefleet",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "trial_lease_idx",
        "trial",
        ["lease_expires_at"],
        unique=False,
        schema="tunefleet",
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "trial_run_state_idx", "trial", ["run_id", "state"], unique=False, schema="tunefleet"
    )
    op.create_index(
        "trial_unreported_idx",
        "trial",
        ["run_id", "id"],
        unique=False,
        schema="tunefleet",
        postgresql_where=sa.text(
            "NOT reported AND state IN ('done', 'invalid', 'failed', 'timed_out')"
        ),
    )
    op.create_table(
        "attempt",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("trial_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.UUID(), nullable=False),
        sa.Column(
            "claimed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('done', 'invalid', 'failed', 'timed_out', 'lease_expired', 'released', 'lost')",
            name="attempt_outcome_valid",
        ),
        sa.ForeignKeyConstraint(["trial_id"], ["tunefleet.trial.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["worker_id"],
            ["tunefleet.worker.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        schema="tunefleet",
    )
    op.create_index(
        "attempt_counted_unique",
        "attempt",
        ["trial_id", "attempt"],
        unique=True,
        schema="tunefleet",
        postgresql_where=sa.text("outcome IS DISTINCT FROM 'released'"),
    )
    op.create_table(
        "measurement",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("trial_id", sa.BigInteger(), nullable=True),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("cache_key", sa.Text(), nullable=False),
        sa.Column("config_hash", sa.Text(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column("problem_args", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("device_id", sa.BigInteger(), nullable=True),
        sa.Column("worker_id", sa.UUID(), nullable=True),
        sa.Column("median_s", sa.DOUBLE_PRECISION(), nullable=False),
        sa.Column("min_s", sa.DOUBLE_PRECISION(), nullable=False),
        sa.Column("samples_s", postgresql.ARRAY(sa.DOUBLE_PRECISION()), nullable=False),
        sa.Column("gflops", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column("gbps", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column("flop_count", sa.Float(), nullable=True),
        sa.Column("byte_count", sa.Float(), nullable=True),
        sa.Column("protocol", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("compile_s", sa.DOUBLE_PRECISION(), nullable=True),
        sa.Column(
            "validation",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "versions",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("code", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), server_default=sa.text("'measured'"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("source IN ('measured', 'imported')", name="measurement_source_valid"),
        sa.CheckConstraint("median_s > 0 AND min_s > 0", name="measurement_times_positive"),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["tunefleet.device.id"],
        ),
        sa.ForeignKeyConstraint(["run_id"], ["tunefleet.run.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["trial_id"], ["tunefleet.trial.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["worker_id"],
            ["tunefleet.worker.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trial_id"),
        schema="tunefleet",
    )
    op.create_index(
        "measurement_cache_idx",
        "measurement",
        ["cache_key", "config_hash"],
        unique=False,
        schema="tunefleet",
    )
    op.create_index(
        "measurement_run_idx", "measurement", ["run_id"], unique=False, schema="tunefleet"
    )

    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW tunefleet.{name} AS {body}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS tunefleet.{name}")
    op.drop_index("measurement_run_idx", table_name="measurement", schema="tunefleet")
    op.drop_index("measurement_cache_idx", table_name="measurement", schema="tunefleet")
    op.drop_table("measurement", schema="tunefleet")
    op.drop_index(
        "attempt_counted_unique",
        table_name="attempt",
        schema="tunefleet",
        postgresql_where=sa.text("outcome IS DISTINCT FROM 'released'"),
    )
    op.drop_table("attempt", schema="tunefleet")
    op.drop_index(
        "trial_unreported_idx",
        table_name="trial",
        schema="tunefleet",
        postgresql_where=sa.text(
            "NOT reported AND state IN ('done', 'invalid', 'failed', 'timed_out')"
        ),
    )
    op.drop_index("trial_run_state_idx", table_name="trial", schema="tunefleet")
    op.drop_index(
        "trial_lease_idx",
        table_name="trial",
        schema="tunefleet",
        postgresql_where=sa.text("state = 'running'"),
    )
    op.drop_index(
        "trial_claim_idx",
        table_name="trial",
        schema="tunefleet",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_table("trial", schema="tunefleet")
    op.drop_index(
        "worker_active_idx",
        table_name="worker",
        schema="tunefleet",
        postgresql_where=sa.text("state = 'active'"),
    )
    op.drop_table("worker", schema="tunefleet")
    op.drop_index("run_cache_key_idx", table_name="run", schema="tunefleet")
    op.drop_table("run", schema="tunefleet")
    op.drop_table("device", schema="tunefleet")
