"""spread: a run's finalists are judged against how far apart fresh processes time a kernel

Samples of one measurement come from one process: on a CPU device they call a 3 % difference
significant while fresh processes of the same binary differ by 25 %, and a run quoted as its
best the one figure its noisiest process gave. Now the coordinator estimates the device's
between-process spread from its finalists' processes (``tunefleet.spread``), judges each
finalist against it, re-times in further fresh processes only what could change the
headline (a shoot-out: more than one confirmation per search trial), and stores:

- ``run.spread_typical``, ``spread_tolerance``, ``spread_processes``: the estimate (the
  median relative difference of two processes of one configuration), what a re-measurement
  must stay within (the ± a best is quoted with), and how many process measurements it rests
  on; ``run.unseparated_trial_id``: the runner-up its best could not be told apart from;
- ``trial.confirm_round`` (confirmations: 1, then 2 and on for the shoot-out's processes;
  ``trial_confirms_unique`` is now one confirmation per search trial *and round*; existing
  confirmations become round 1), ``trial.standing`` (agrees / disagrees), ``figure_s`` (the
  median of its consistent processes' medians) and ``processes`` on a judged search trial;
- ``results`` appends ``standing``, ``figure_s`` and ``processes``; ``confirmations`` appends
  ``confirm_round``; ``best_per_run`` ranks a finalist that agrees
  before any other (each by ``figure_s`` where judged), joins the
  first round's confirmation only, and appends ``standing``, ``figure_s``, ``figure_gflops``,
  ``processes``, ``spread_tolerance``, ``spread_typical`` and ``unseparated_trial_id``;
  ``run_progress`` quotes the judged figure, decides ``best_status`` from the standing, and
  appends ``best_spread``, ``best_processes`` and ``unseparated_trial_id``.

Runs judged before this revision have no standing: they rank as they did.

Revision ID: 0016_spread
Revises: 0015_timeline
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016_spread"
down_revision = "0015_timeline"
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
       t.state = 'invalid' AND t.attempt = 0 AND t.source <> 'cache' AS ruled_out,
       t.standing,
       t.figure_s,
       t.processes
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
       nc.noise AS confirmed_noise,
       CASE WHEN mo.code IS NULL AND mc.code IS NULL THEN NULL
            ELSE mo.code IS NOT DISTINCT FROM mc.code END AS same_source,
       coalesce((mc.protocol ->> 'cold_build')::boolean, false) AS cold_build,
       c.confirm_round
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
SELECT b.run_id,
       b.problem,
       b.problem_args,
       b.device_class,
       b.trial_id,
       b.config,
       b.median_s,
       b.min_s,
       b.gflops,
       b.gbps,
       b.device_name,
       b.confirmed,
       b.confirm_trial_id,
       b.confirmed_median_s,
       b.confirmed_gflops,
       b.spread,
       b.noise,
       b.disagrees,
       b.agreement_p,
       n.noise AS measured_noise,
       n.noise > (b.protocol ->> 'noise_limit')::double precision AS noisy,
       b.same_source,
       b.cold_build,
       b.standing,
       b.figure_s,
       b.gflops * b.median_s / b.figure_s AS figure_gflops,
       b.processes,
       b.spread_tolerance,
       b.spread_typical,
       b.unseparated_trial_id
  FROM (SELECT DISTINCT ON (t.run_id)
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
               c.same_source,
               c.cold_build,
               m.samples_s,
               m.protocol,
               t.standing,
               t.figure_s,
               t.processes,
               r.spread_tolerance,
               r.spread_typical,
               CASE WHEN r.unseparated_trial_id <> t.id THEN r.unseparated_trial_id
               END AS unseparated_trial_id
          FROM tunefleet.trial t
          JOIN tunefleet.run r ON r.id = t.run_id
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id AND c.confirm_round = 1
         WHERE t.state = 'done' AND t.purpose = 'search'
         ORDER BY t.run_id,
                  coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
                  CASE WHEN t.standing = 'agrees' THEN 0 ELSE 1 END,
                  coalesce(t.figure_s, c.confirmed_median_s, m.median_s),
                  t.id) b
 CROSS JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(b.samples_s) AS x) n
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
       CASE WHEN b.figure_s IS NOT NULL THEN b.figure_gflops
            WHEN b.confirmed THEN b.confirmed_gflops ELSE b.gflops END AS best_gflops,
       CASE WHEN b.figure_s IS NOT NULL THEN b.figure_s
            WHEN b.confirmed THEN b.confirmed_median_s ELSE b.median_s END AS best_median_s,
       a.created_at,
       a.elapsed,
       (a.finished - a.ruled_out) / a.minutes AS evaluations_per_minute,
       a.confirmed,
       a.confirming,
       CASE WHEN b.trial_id IS NULL THEN NULL
            WHEN b.standing = 'agrees' THEN 'confirmed'
            WHEN b.standing = 'disagrees' THEN 'not reproduced'
            WHEN b.confirmed AND b.disagrees = false THEN 'confirmed'
            WHEN b.disagrees THEN 'not reproduced'
            ELSE 'unconfirmed' END AS best_status,
       b.trial_id AS best_trial_id,
       a.ruled_out,
       CASE WHEN b.standing = 'agrees' THEN b.spread_tolerance END AS best_spread,
       b.processes AS best_processes,
       b.unseparated_trial_id
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

# The same views as 0014_ruled_out (results, run_progress) and 0013_cold_confirmation
# (confirmations, best_per_run) defined them (for the downgrade).
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
       nc.noise AS confirmed_noise,
       CASE WHEN mo.code IS NULL AND mc.code IS NULL THEN NULL
            ELSE mo.code IS NOT DISTINCT FROM mc.code END AS same_source,
       coalesce((mc.protocol ->> 'cold_build')::boolean, false) AS cold_build
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
SELECT b.run_id,
       b.problem,
       b.problem_args,
       b.device_class,
       b.trial_id,
       b.config,
       b.median_s,
       b.min_s,
       b.gflops,
       b.gbps,
       b.device_name,
       b.confirmed,
       b.confirm_trial_id,
       b.confirmed_median_s,
       b.confirmed_gflops,
       b.spread,
       b.noise,
       b.disagrees,
       b.agreement_p,
       n.noise AS measured_noise,
       n.noise > (b.protocol ->> 'noise_limit')::double precision AS noisy,
       b.same_source,
       b.cold_build
  FROM (SELECT DISTINCT ON (t.run_id)
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
               c.same_source,
               c.cold_build,
               m.samples_s,
               m.protocol
          FROM tunefleet.trial t
          JOIN tunefleet.run r ON r.id = t.run_id
          JOIN tunefleet.measurement m ON m.trial_id = t.id
          LEFT JOIN tunefleet.device d ON d.id = m.device_id
          LEFT JOIN tunefleet.confirmations c ON c.trial_id = t.id
         WHERE t.state = 'done' AND t.purpose = 'search'
         ORDER BY t.run_id,
                  coalesce(c.state IN ('invalid', 'failed', 'timed_out'), false),
                  coalesce(c.confirmed_median_s, m.median_s),
                  t.id) b
 CROSS JOIN LATERAL (SELECT (percentile_cont(0.75) WITHIN GROUP (ORDER BY x)
                             - percentile_cont(0.25) WITHIN GROUP (ORDER BY x))
                            / percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS noise
                       FROM unnest(b.samples_s) AS x) n
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


def upgrade() -> None:
    for column in ("spread_typical", "spread_tolerance"):
        op.add_column("run", sa.Column(column, postgresql.DOUBLE_PRECISION()), schema=SCHEMA)
    op.add_column("run", sa.Column("spread_processes", sa.Integer()), schema=SCHEMA)
    op.add_column("run", sa.Column("unseparated_trial_id", sa.BigInteger()), schema=SCHEMA)
    op.add_column("trial", sa.Column("confirm_round", sa.Integer()), schema=SCHEMA)
    op.add_column("trial", sa.Column("standing", sa.Text()), schema=SCHEMA)
    op.add_column("trial", sa.Column("figure_s", postgresql.DOUBLE_PRECISION()), schema=SCHEMA)
    op.add_column("trial", sa.Column("processes", sa.Integer()), schema=SCHEMA)
    op.execute("UPDATE tunefleet.trial SET confirm_round = 1 WHERE purpose = 'confirm'")
    op.create_check_constraint(
        "trial_confirm_round_valid",
        "trial",
        "(purpose = 'confirm') = (confirm_round IS NOT NULL) AND coalesce(confirm_round, 1) >= 1",
        schema=SCHEMA,
    )
    op.create_check_constraint(
        "trial_standing_valid",
        "trial",
        "standing IS NULL OR (purpose = 'search' AND standing IN ('agrees', 'disagrees'))",
        schema=SCHEMA,
    )
    op.drop_index("trial_confirms_unique", table_name="trial", schema=SCHEMA)
    op.create_index(
        "trial_confirms_unique",
        "trial",
        ["confirms_trial_id", "confirm_round"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'confirm'"),
    )
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    # Appended columns cannot be dropped by CREATE OR REPLACE: drop and recreate, dependents
    # first (run_progress reads best_per_run and results; best_per_run reads confirmations).
    for name in reversed(list(PREVIOUS_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    for name, body in PREVIOUS_VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")
    # Only the first round fits the old one-confirmation-per-trial index.
    op.execute("DELETE FROM tunefleet.trial WHERE purpose = 'confirm' AND confirm_round > 1")
    op.drop_index("trial_confirms_unique", table_name="trial", schema=SCHEMA)
    op.create_index(
        "trial_confirms_unique",
        "trial",
        ["confirms_trial_id"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("purpose = 'confirm'"),
    )
    op.drop_constraint("trial_standing_valid", "trial", schema=SCHEMA)
    op.drop_constraint("trial_confirm_round_valid", "trial", schema=SCHEMA)
    for column in ("processes", "figure_s", "standing", "confirm_round"):
        op.drop_column("trial", column, schema=SCHEMA)
    for column in (
        "unseparated_trial_id",
        "spread_processes",
        "spread_tolerance",
        "spread_typical",
    ):
        op.drop_column("run", column, schema=SCHEMA)
