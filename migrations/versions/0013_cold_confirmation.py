"""cold confirmation: a confirmation is built in a fresh process, and its code is compared

The best a run reports must be the kernel the user gets. A confirmation re-measured the best
configuration on a worker whose code-generation and device processes had served the whole
search, through the same caches (loopy's schedule and code caches, the executor's, pyopencl's
and the driver's binaries): a cache answering with another kernel's code would confirm its
own mistake. Now:

- ``claim_trials`` marks a confirmation's protocol ``cold_build: true``; the worker builds and
  times such a trial in a fresh process whose caches share nothing with the search;
- ``confirmations`` and ``best_per_run`` gain ``same_source`` (the re-measurement generated
  the very code the search measured: ``mo.code IS NOT DISTINCT FROM mc.code``) and
  ``cold_build``; the coordinator's verdict counts a different source as a disagreement;
  ``best_per_run`` computes the noise of its best alone (it computed it for every trial);
- one best everywhere: ``run_progress.best_gflops`` / ``best_median_s`` are the figures of
  ``best_per_run``'s best (its confirmed figures once confirmed; before, the fastest search
  measurement, whatever its confirmation said), and ``best_status`` (confirmed, not
  reproduced, unconfirmed) and ``best_trial_id`` are appended.

Views keep their columns (new ones are appended), so ``CREATE OR REPLACE`` keeps their
dependents. ``claim_trials`` keeps its signature.

Revision ID: 0013_cold_confirmation
Revises: 0012_measurement_trust
Create Date: 2026-12-04 18:00:00
"""

from __future__ import annotations

from alembic import op

from tunefleet.migrations.functions import Function, create

revision = "0013_cold_confirmation"
down_revision = "0012_measurement_trust"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

CLAIM_TRIALS = Function(
    name="claim_trials",
    args=(
        "p_worker_id uuid, p_secret text, p_classes text[], p_limit integer, "
        "p_lease_s double precision, p_excluded_runs bigint[], p_skipped_trials bigint[], "
        "p_alive_s double precision"
    ),
    returns=(
        "TABLE (trial_id bigint, run_id bigint, attempt integer, max_attempts integer, "
        "config jsonb, config_hash text, timeout_s double precision, device_class text, "
        "problem text, problem_args jsonb, protocol jsonb, cache_key text, lease_token text)"
    ),
    # Queue rule 1, unchanged; a confirmation's protocol says ``cold_build``.
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  PERFORM tunefleet._check_worker(p_worker_id, p_secret);
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim limit %s is not between 1 and 1000', p_limit);
  END IF;
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  RETURN QUERY
  WITH picked AS (
      SELECT p.id
        FROM (SELECT DISTINCT unnest(p_classes)) AS c(device_class)
       CROSS JOIN LATERAL (
             SELECT t.id, t.priority FROM tunefleet.trial t
              WHERE t.state = 'pending' AND t.device_class = c.device_class
                AND t.run_id <> ALL(coalesce(p_excluded_runs, '{}'))
                AND t.id <> ALL(coalesce(p_skipped_trials, '{}'))
                -- a confirmation leaves the original's worker alone while another can serve
                -- it (0008_confirmation's claim)
                AND (t.avoid_worker IS DISTINCT FROM p_worker_id
                     OR t.avoid_until <= now()
                     OR NOT EXISTS (
                          SELECT 1 FROM tunefleet.worker w
                           WHERE w.state = 'active' AND w.id <> p_worker_id
                             AND w.heartbeat_at > now() - make_interval(secs => p_alive_s)
                             AND (w.device_class = t.device_class OR t.device_class = 'any')
                             AND NOT EXISTS (
                                  SELECT 1 FROM tunefleet.stand_aside s
                                   WHERE s.worker_id = w.id AND s.run_id = t.run_id)))
              ORDER BY t.priority, t.id
              LIMIT p_limit
              FOR UPDATE SKIP LOCKED
             ) p
       ORDER BY p.priority, p.id
       LIMIT p_limit
  ), leased AS (
      SELECT picked.id, tunefleet._new_secret() AS token FROM picked
  ), claimed AS (
      UPDATE tunefleet.trial t
         SET state = 'running',
             -- one past both the counter and the counted history (0004_stand_aside's claim)
             attempt = 1 + greatest(
                 t.attempt,
                 (SELECT max(a.attempt) FROM tunefleet.attempt a
                   WHERE a.trial_id = t.id AND a.outcome IS DISTINCT FROM 'released')),
             lease_owner = p_worker_id,
             lease_expires_at = now() + make_interval(secs => p_lease_s),
             lease_token_hash = sha256(convert_to(l.token, 'UTF8')),
             started_at = now(),
             finished_at = NULL
        FROM leased l
       WHERE t.id = l.id
   RETURNING t.id, t.run_id, t.attempt, t.max_attempts, t.config, t.config_hash,
             t.timeout_s, t.device_class, t.priority, t.input_seed, t.purpose, l.token
  ), recorded AS (
      INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id)
      SELECT c.id, c.attempt, p_worker_id FROM claimed c
  )
  SELECT c.id, c.run_id, c.attempt, c.max_attempts, c.config, c.config_hash, c.timeout_s,
         c.device_class, r.problem, r.problem_args,
         CASE WHEN c.input_seed IS NULL THEN r.protocol
              ELSE jsonb_set(r.protocol, '{seed}', to_jsonb(c.input_seed)) END
           -- a confirmation is built cold (0013_cold_confirmation)
           || CASE WHEN c.purpose = 'confirm' THEN '{"cold_build": true}'::jsonb
                   ELSE '{}'::jsonb END,
         r.cache_key, c.token
    FROM claimed c
    JOIN tunefleet.run r ON r.id = c.run_id
   ORDER BY c.priority, c.id;
END
""",
)

CLAIM_TRIALS_0003 = Function(
    name="claim_trials",
    args=(
        "p_worker_id uuid, p_secret text, p_classes text[], p_limit integer, "
        "p_lease_s double precision, p_excluded_runs bigint[], p_skipped_trials bigint[], "
        "p_alive_s double precision"
    ),
    returns=(
        "TABLE (trial_id bigint, run_id bigint, attempt integer, max_attempts integer, "
        "config jsonb, config_hash text, timeout_s double precision, device_class text, "
        "problem text, problem_args jsonb, protocol jsonb, cache_key text, lease_token text)"
    ),
    # As 0003_worker_functions installed it (for the downgrade).
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  PERFORM tunefleet._check_worker(p_worker_id, p_secret);
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('claim limit %s is not between 1 and 1000', p_limit);
  END IF;
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  RETURN QUERY
  WITH picked AS (
      SELECT p.id
        FROM (SELECT DISTINCT unnest(p_classes)) AS c(device_class)
       CROSS JOIN LATERAL (
             SELECT t.id, t.priority FROM tunefleet.trial t
              WHERE t.state = 'pending' AND t.device_class = c.device_class
                AND t.run_id <> ALL(coalesce(p_excluded_runs, '{}'))
                AND t.id <> ALL(coalesce(p_skipped_trials, '{}'))
                -- a confirmation leaves the original's worker alone while another can serve
                -- it (0008_confirmation's claim)
                AND (t.avoid_worker IS DISTINCT FROM p_worker_id
                     OR t.avoid_until <= now()
                     OR NOT EXISTS (
                          SELECT 1 FROM tunefleet.worker w
                           WHERE w.state = 'active' AND w.id <> p_worker_id
                             AND w.heartbeat_at > now() - make_interval(secs => p_alive_s)
                             AND (w.device_class = t.device_class OR t.device_class = 'any')
                             AND NOT EXISTS (
                                  SELECT 1 FROM tunefleet.stand_aside s
                                   WHERE s.worker_id = w.id AND s.run_id = t.run_id)))
              ORDER BY t.priority, t.id
              LIMIT p_limit
              FOR UPDATE SKIP LOCKED
             ) p
       ORDER BY p.priority, p.id
       LIMIT p_limit
  ), leased AS (
      SELECT picked.id, tunefleet._new_secret() AS token FROM picked
  ), claimed AS (
      UPDATE tunefleet.trial t
         SET state = 'running',
             -- one past both the counter and the counted history (0004_stand_aside's claim)
             attempt = 1 + greatest(
                 t.attempt,
                 (SELECT max(a.attempt) FROM tunefleet.attempt a
                   WHERE a.trial_id = t.id AND a.outcome IS DISTINCT FROM 'released')),
             lease_owner = p_worker_id,
             lease_expires_at = now() + make_interval(secs => p_lease_s),
             lease_token_hash = sha256(convert_to(l.token, 'UTF8')),
             started_at = now(),
             finished_at = NULL
        FROM leased l
       WHERE t.id = l.id
   RETURNING t.id, t.run_id, t.attempt, t.max_attempts, t.config, t.config_hash,
             t.timeout_s, t.device_class, t.priority, t.input_seed, l.token
  ), recorded AS (
      INSERT INTO tunefleet.attempt (trial_id, attempt, worker_id)
      SELECT c.id, c.attempt, p_worker_id FROM claimed c
  )
  SELECT c.id, c.run_id, c.attempt, c.max_attempts, c.config, c.config_hash, c.timeout_s,
         c.device_class, r.problem, r.problem_args,
         CASE WHEN c.input_seed IS NULL THEN r.protocol
              ELSE jsonb_set(r.protocol, '{seed}', to_jsonb(c.input_seed)) END,
         r.cache_key, c.token
    FROM claimed c
    JOIN tunefleet.run r ON r.id = c.run_id
   ORDER BY c.priority, c.id;
END
""",
)

# Frozen copies of the views as this revision creates them (schema.VIEWS may move on), in
# creation order (dependencies first).
VIEWS = {
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

# The same views as 0012_measurement_trust (confirmations, best_per_run) and
# 0008_confirmations (run_progress) defined them (for the downgrade).
PREVIOUS_VIEWS = {
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


def upgrade() -> None:
    create([CLAIM_TRIALS])
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    # Appended columns cannot be dropped by CREATE OR REPLACE: drop and recreate, dependents
    # first (run_progress depends on best_per_run, which depends on confirmations).
    for name in reversed(list(PREVIOUS_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    for name, body in PREVIOUS_VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")
    create([CLAIM_TRIALS_0003])
