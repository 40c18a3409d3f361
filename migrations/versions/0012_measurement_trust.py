"""measurement trust: robust noise, a confirmation verdict that can fail, noisy flags

The ``confirmations`` view called two measurements in agreement while their medians were
closer than the full range of either sample set over its median: with hundreds of samples on
a busy machine that range is several hundred percent, so a 2x disagreement still agreed. Now:

- ``noise`` is the inter-quartile range over the median (``percentile_cont``), in the views;
- ``disagrees`` is the coordinator's verdict (``tunefleet.agreement``: a Mann-Whitney rank
  test at 1 % behind a 3 % floor), stored on the confirmation trial (``trial.disagrees``,
  ``trial.agreement_p``) so that the view, ``tunefleet best`` and the coordinator's own
  report read one decision; NULL until judged;
- ``results`` and ``best_per_run`` gain ``noise`` / ``measured_noise`` and ``noisy`` (the
  samples' noise exceeds the measurement protocol's ``noise_limit``: the worker took every
  sample the protocol allows and it stayed noisy; NULL under protocols without a limit).

Views keep their columns (new ones are appended), so ``CREATE OR REPLACE`` keeps their
dependents.

Revision ID: 0012_measurement_trust
Revises: 0011_fleet_shape
Create Date: 2026-12-03 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012_measurement_trust"
down_revision = "0011_fleet_shape"
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
       greatest(no.noise, nc.noise) AS noise,
       CASE WHEN c.state = 'done' THEN c.disagrees
            WHEN c.state IN ('invalid', 'failed', 'timed_out') THEN true
       END AS disagrees,
       c.finished_at,
       c.agreement_p,
       no.noise AS original_noise,
       nc.noise AS confirmed_noise
  FROM tunefleet.trial c
  JOIN tunefleet.trial o ON o.id = c.confirms_trial_id
  LEFT JOIN tunefleet.measurement mo ON mo.trial_id = o.id
  LEFT JOIN tunefleet.measurement mc ON mc.trial_id = c.id
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(mo.samples_s) AS x) no ON mo.id IS NOT NULL
  LEFT JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(mc.samples_s) AS x) nc ON mc.id IS NOT NULL
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
       c.disagrees,
       c.agreement_p,
       n.noise AS measured_noise,
       n.noise > (m.protocol ->> 'noise_limit')::double precision AS noisy
  FROM tunefleet.trial t
  JOIN tunefleet.run r ON r.id = t.run_id
  JOIN tunefleet.measurement m ON m.trial_id = t.id
  LEFT JOIN tunefleet.device d ON d.id = m.device_id
  LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id
  CROSS JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                              - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                             / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                        FROM unnest(m.samples_s) AS x) n
 WHERE t.state = 'done' AND t.purpose = 'search'
 ORDER BY t.run_id,
          coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
          coalesce(c.confirmed_median_s, m.median_s),
          t.id
""",
}

# The same views as 0008_confirmations defined them (for the downgrade).
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
}


def upgrade() -> None:
    op.add_column("trial", sa.Column("disagrees", sa.Boolean(), nullable=True), schema=SCHEMA)
    op.add_column(
        "trial",
        sa.Column("agreement_p", postgresql.DOUBLE_PRECISION(), nullable=True),
        schema=SCHEMA,
    )
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    # Appended columns cannot be dropped by CREATE OR REPLACE: drop and recreate, dependents
    # first.
    for name in reversed(list(PREVIOUS_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    for name, body in PREVIOUS_VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")
    op.drop_column("trial", "agreement_p", schema=SCHEMA)
    op.drop_column("trial", "disagrees", schema=SCHEMA)
