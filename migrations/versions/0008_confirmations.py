"""confirmations: a run re-measures its best configurations before it reports the best

A confirmation is a trial of purpose ``confirm`` beside the run's search trials: it names the
search trial it re-measures (``confirms_trial_id``), the worker it should avoid while another
one is live (``avoid_worker`` until ``avoid_until``) and the input seed of its fresh inputs
(``input_seed``). The one-search-trial-per-configuration rule becomes a partial unique index
over search trials; each search trial has at most one confirmation. The views ``results``
and ``run_progress`` keep to search trials, ``confirmations`` is new and ``best_per_run``
ranks by the confirmed figure.

Revision ID: 0008_confirmations
Revises: 0005_worker_sizing
Create Date: 2026-12-01 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_confirmations"
down_revision = "0005_worker_sizing"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

# Frozen copies of the views this revision replaces, in creation order (dependencies first).
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
 WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out') AND t.purpose = 'search'
""",
    "confirmations": """
SELECT c.run_id,
       c.confirms_trial_id AS trial_id,
       c.id AS confirm_trial_id,
       o.config,
       c.state,
       c.input_seed,
       mo.median_s AS original_median_s,
       mc.median_s AS confirmed_median_s,
       mo.gflops AS original_gflops,
       mc.gflops AS confirmed_gflops,
       mo.worker_id AS original_worker_id,
       mc.worker_id AS confirm_worker_id,
       (greatest(mo.median_s, mc.median_s) - least(mo.median_s, mc.median_s))
         / least(mo.median_s, mc.median_s) AS spread,
       greatest((SELECT max(x) - min(x) FROM unnest(mo.samples_s) AS x) / mo.median_s,
                (SELECT max(x) - min(x) FROM unnest(mc.samples_s) AS x) / mc.median_s)
         AS noise,
       CASE WHEN c.state = 'done'
            THEN (greatest(mo.median_s, mc.median_s) - least(mo.median_s, mc.median_s))
                   / least(mo.median_s, mc.median_s)
                 > greatest((SELECT max(x) - min(x) FROM unnest(mo.samples_s) AS x)
                              / mo.median_s,
                            (SELECT max(x) - min(x) FROM unnest(mc.samples_s) AS x)
                              / mc.median_s)
            WHEN c.state IN ('invalid', 'failed', 'timed_out') THEN true
       END AS disagrees,
       c.finished_at
  FROM tunefleet.trial c
  JOIN tunefleet.trial o ON o.id = c.confirms_trial_id
  LEFT JOIN tunefleet.measurement mo ON mo.trial_id = o.id
  LEFT JOIN tunefleet.measurement mc ON mc.trial_id = c.id
 WHERE c.purpose = 'confirm'
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
       d.name AS device_name,
       c.state = 'done' AS confirmed,
       c.confirm_trial_id,
       c.confirmed_median_s,
       c.confirmed_gflops,
       c.spread,
       c.noise,
       c.disagrees
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id
 WHERE t.state = 'done' AND t.purpose = 'search'
 ORDER BY t.run_id,
          coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
          coalesce(c.confirmed_median_s, m.median_s),
          t.id
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
                    1e-9) AS evaluations_per_minute,
       (SELECT count(*) FROM tunefleet.trial c
         WHERE c.run_id = r.id AND c.purpose = 'confirm'
           AND c.state IN ('done', 'invalid', 'failed', 'timed_out')) AS confirmed,
       (SELECT count(*) FROM tunefleet.trial c
         WHERE c.run_id = r.id AND c.purpose = 'confirm'
           AND c.state IN ('pending', 'running')) AS confirming
  FROM tunefleet.run r
  LEFT JOIN tunefleet.trial t ON t.run_id = r.id AND t.purpose = 'search'
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
 GROUP BY r.id
""",
}

# The same views as the previous revision defined them (for the downgrade).
PREVIOUS_VIEWS = {
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
    for name in ("run_progress", "best_per_run", "results"):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    op.add_column(
        "trial",
        sa.Column("purpose", sa.Text(), server_default=sa.text("'search'"), nullable=False),
        schema=SCHEMA,
    )
    op.add_column(
        "trial", sa.Column("confirms_trial_id", sa.BigInteger(), nullable=True), schema=SCHEMA
    )
    op.add_column("trial", sa.Column("avoid_worker", sa.UUID(), nullable=True), schema=SCHEMA)
    op.add_column(
        "trial", sa.Column("avoid_until", sa.DateTime(timezone=True), nullable=True), schema=SCHEMA
    )
    op.add_column("trial", sa.Column("input_seed", sa.Integer(), nullable=True), schema=SCHEMA)
    op.create_foreign_key(
        "trial_confirms_trial_id_fkey",
        "trial",
        "trial",
        ["confirms_trial_id"],
        ["id"],
        source_schema=SCHEMA,
        referent_schema=SCHEMA,
        ondelete="CASCADE",
    )
    op.create_check_constraint(
        "trial_purpose_valid", "trial", "purpose IN ('search', 'confirm')", schema=SCHEMA
    )
    op.create_check_constraint(
        "trial_confirm_names_its_trial",
        "trial",
        "(purpose = 'confirm') = (confirms_trial_id IS NOT NULL)",
        schema=SCHEMA,
    )
    op.drop_constraint("trial_run_config_unique", "trial", schema=SCHEMA, type_="unique")
    op.create_index(
        "trial_run_config_unique",
        "trial",
        ["run_id", "config_hash"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'search'"),
    )
    op.create_index(
        "trial_confirms_unique",
        "trial",
        ["confirms_trial_id"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'confirm'"),
    )
    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    # Confirmations repeat configurations: they cannot stay under the old unique rule.
    op.execute("DELETE FROM tunefleet.trial WHERE purpose = 'confirm'")
    op.drop_index(
        "trial_confirms_unique",
        table_name="trial",
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'confirm'"),
    )
    op.drop_index(
        "trial_run_config_unique",
        table_name="trial",
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'search'"),
    )
    op.create_unique_constraint(
        "trial_run_config_unique", "trial", ["run_id", "config_hash"], schema=SCHEMA
    )
    op.drop_constraint("trial_confirm_names_its_trial", "trial", schema=SCHEMA, type_="check")
    op.drop_constraint("trial_purpose_valid", "trial", schema=SCHEMA, type_="check")
    op.drop_constraint("trial_confirms_trial_id_fkey", "trial", schema=SCHEMA, type_="foreignkey")
    for column in ("input_seed", "avoid_until", "avoid_worker", "confirms_trial_id", "purpose"):
        op.drop_column("trial", column, schema=SCHEMA)
    for name, body in PREVIOUS_VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")
