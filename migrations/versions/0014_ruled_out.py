"""ruled out: the rules' rejections counted once, and not as evaluations

A configuration the problem's own rules reject is stored as an ``invalid`` search trial that no
worker ever claimed (``attempt`` 0, not a verdict of the cache): it costs the run no
evaluation, and ``--max-trials`` does not count it. The reports counted such trials apart, each
with its own copy of that predicate, while ``run_progress.evaluations_per_minute`` counted them
as evaluations (a run whose rules reject much of its space looked faster than its workers).
Now:

- ``results`` gains ``ruled_out`` (the one definition of the term);
- ``run_progress`` gains ``ruled_out`` (how many of its ``invalid`` trials are so), and its
  ``evaluations_per_minute`` leaves them out. ``invalid`` keeps its meaning: every invalid
  search trial.

Views keep their columns (new ones are appended), so ``CREATE OR REPLACE`` keeps their
dependents; ``run_progress`` now reads ``results``, so the downgrade drops and recreates both.

Revision ID: 0014_ruled_out
Revises: 0013_cold_confirmation
Create Date: 2026-12-05 18:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0014_ruled_out"
down_revision = "0013_cold_confirmation"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

# Frozen copies of the views as this revision creates them (schema.VIEWS may move on), in
# creation order (dependencies first).
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
       t.finished_at,
       n.noise,
       n.noise > (m.protocol ->> 'noise_limit')::double precision AS noisy,
       t.state = 'invalid' AND t.attempt = 0 AND t.source <> 'cache' AS ruled_out
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = t.lease_owner
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(m.samples_s) AS x) n ON m.id IS NOT NULL
 WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out') AND t.purpose = 'search'
""",
    "run_progress": """
SELECT a.run_id,
       a.name,
       a.problem,
       a.device_class,
       a.run_state,
       a.stop_reason,
       a.trials,
       a.pending,
       a.running,
       a.done,
       a.invalid,
       a.failed,
       a.timed_out,
       a.cancelled,
       a.cached,
       CASE WHEN b.confirmed THEN b.confirmed_gflops ELSE b.gflops END AS best_gflops,
       CASE WHEN b.confirmed THEN b.confirmed_median_s ELSE b.median_s END AS best_median_s,
       a.created_at,
       a.elapsed,
       (a.finished - a.ruled_out) / a.minutes AS evaluations_per_minute,
       a.confirmed,
       a.confirming,
       CASE WHEN b.trial_id IS NULL THEN NULL
            WHEN b.confirmed AND b.disagrees = false THEN 'confirmed'
            WHEN b.disagrees THEN 'not reproduced'
            ELSE 'unconfirmed' END AS best_status,
       b.trial_id AS best_trial_id,
       a.ruled_out
  FROM (SELECT r.id AS run_id,
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
               r.created_at,
               coalesce(r.finished_at, now()) - r.created_at AS elapsed,
               count(t.id) FILTER (WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out'))
                 AS finished,
               greatest(extract(epoch FROM coalesce(r.finished_at, now()) - r.created_at)
                        / 60.0, 1e-9) AS minutes,
               (SELECT count(*) FROM tunefleet.results x WHERE x.run_id = r.id AND x.ruled_out)
                 AS ruled_out,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('done', 'invalid', 'failed', 'timed_out')) AS confirmed,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('pending', 'running')) AS confirming
          FROM tunefleet.run r
          LEFT JOIN tunefleet.trial t ON t.run_id = r.id AND t.purpose = 'search'
         GROUP BY r.id) a
  LEFT JOIN tunefleet.best_per_run b ON b.run_id = a.run_id
""",
}

# As 0012_measurement_trust (results) and 0013_cold_confirmation (run_progress) left them.
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
       t.finished_at,
       n.noise,
       n.noise > (m.protocol ->> 'noise_limit')::double precision AS noisy
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = t.lease_owner
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(m.samples_s) AS x) n ON m.id IS NOT NULL
 WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out') AND t.purpose = 'search'
""",
    "run_progress": """
SELECT a.run_id,
       a.name,
       a.problem,
       a.device_class,
       a.run_state,
       a.stop_reason,
       a.trials,
       a.pending,
       a.running,
       a.done,
       a.invalid,
       a.failed,
       a.timed_out,
       a.cancelled,
       a.cached,
       CASE WHEN b.confirmed THEN b.confirmed_gflops ELSE b.gflops END AS best_gflops,
       CASE WHEN b.confirmed THEN b.confirmed_median_s ELSE b.median_s END AS best_median_s,
       a.created_at,
       a.elapsed,
       a.evaluations_per_minute,
       a.confirmed,
       a.confirming,
       CASE WHEN b.trial_id IS NULL THEN NULL
            WHEN b.confirmed AND b.disagrees = false THEN 'confirmed'
            WHEN b.disagrees THEN 'not reproduced'
            ELSE 'unconfirmed' END AS best_status,
       b.trial_id AS best_trial_id
  FROM (SELECT r.id AS run_id,
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
               r.created_at,
               coalesce(r.finished_at, now()) - r.created_at AS elapsed,
               count(t.id) FILTER (WHERE t.state IN ('done', 'invalid', 'failed', 'timed_out'))
                 / greatest(extract(epoch FROM coalesce(r.finished_at, now()) - r.created_at)
                            / 60.0, 1e-9) AS evaluations_per_minute,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('done', 'invalid', 'failed', 'timed_out')) AS confirmed,
               (SELECT count(*) FROM tunefleet.trial c
                 WHERE c.run_id = r.id AND c.purpose = 'confirm'
                   AND c.state IN ('pending', 'running')) AS confirming
          FROM tunefleet.run r
          LEFT JOIN tunefleet.trial t ON t.run_id = r.id AND t.purpose = 'search'
         GROUP BY r.id) a
  LEFT JOIN tunefleet.best_per_run b ON b.run_id = a.run_id
""",
}


def upgrade() -> None:
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    # Appended columns cannot be dropped by CREATE OR REPLACE: drop and recreate, the
    # dependent first (run_progress reads results).
    for name in reversed(list(PREVIOUS_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    for name, body in PREVIOUS_VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")
