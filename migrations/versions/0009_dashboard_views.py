"""dashboard views: what the reader role needs to watch a run in a browser

``tunefleet dashboard`` is meant to run with the reader role, which may read views only. Three
views give it what ``run_progress``, ``results`` and ``standing_aside`` leave out:
``run_settings`` (a run's arguments, protocol and budget, without its space), ``workers``
(every worker process with its device and the trials it holds now, never its secret) and
``trial_details`` (every trial in any state with its measurement and generated code). No
table changes.

Revision ID: 0009_dashboard_views
Revises: 0003_worker_functions
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0009_dashboard_views"
down_revision = "0003_worker_functions"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

# Frozen copies of the views as this revision creates them (schema.VIEWS may move on).
VIEWS = {
    "run_settings": """
SELECT r.id AS run_id,
       r.name,
       r.problem,
       r.problem_args,
       r.device_class,
       r.protocol,
       r.search,
       r.max_trials,
       r.max_seconds,
       r.target_gflops,
       r.patience,
       r.state,
       r.stop_reason,
       r.coordinator_heartbeat_at,
       r.created_at,
       r.finished_at
  FROM tunefleet.run r
""",
    "workers": """
SELECT w.id AS worker_id,
       w.host,
       w.pid,
       w.state,
       w.device_class,
       w.version,
       d.name AS device_name,
       d.platform,
       d.vendor,
       d.driver_version,
       d.compute_units,
       w.started_at,
       w.heartbeat_at,
       w.stopped_at,
       w.capacity,
       w.prepare_workers,
       w.prefetch,
       w.sizing,
       w.device_busy,
       coalesce(h.holding, 0) AS holding,
       h.current_trial,
       h.holding_runs
  FROM tunefleet.worker w
  LEFT JOIN tunefleet.device d ON d.id = w.device_id
  LEFT JOIN (SELECT t.lease_owner,
                    count(*) AS holding,
                    min(t.id) AS current_trial,
                    array_agg(DISTINCT t.run_id ORDER BY t.run_id) AS holding_runs
               FROM tunefleet.trial t
              WHERE t.state = 'running'
              GROUP BY t.lease_owner) h ON h.lease_owner = w.id
""",
    "trial_details": """
SELECT t.run_id,
       t.id AS trial_id,
       t.purpose,
       t.confirms_trial_id,
       t.device_class,
       t.config,
       t.config_hash,
       t.state,
       t.source,
       t.attempt,
       t.max_attempts,
       t.error,
       t.input_seed,
       t.created_at,
       t.started_at,
       t.finished_at,
       m.median_s,
       m.min_s,
       m.samples_s,
       m.gflops,
       m.gbps,
       m.flop_count,
       m.byte_count,
       m.compile_s,
       m.protocol,
       m.validation,
       m.versions,
       m.code,
       m.source AS measurement_source,
       d.name AS device_name,
       d.platform,
       d.driver_version,
       coalesce(m.worker_id, t.lease_owner) AS worker_id,
       w.host AS worker_host,
       t.lease_owner
  FROM tunefleet.trial t
  LEFT JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.worker w ON w.id = coalesce(m.worker_id, t.lease_owner)
""",
}


def upgrade() -> None:
    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
