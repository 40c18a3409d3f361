"""timeline: where each evaluation's wall time went, stored per attempt

A worker now sends, with every completion, the seconds its attempt spent in each phase
(``tunefleet.timeline.Phase``: waiting for a code-generation process, code generation, OpenCL
builds, hand-offs between processes, waiting for the device, the device process's setup,
validation, timing, reference and checks, reporting). They are stored on the attempt row
(``attempt.timeline``, a JSON object of seconds) by ``complete_trial``, which gains the
argument ``p_timeline`` (NULL: none) and refuses a timeline that is not an object of known
phases with seconds between 0 and a week (``_check_timeline``).

Three views read them:

- ``timeline``: one row per ended attempt with a timeline: each phase as a column (0 where
  absent), the wait in the queue before the claim (``queued_s``), the attempt's wall time on
  the database clock (``wall_s``) and what the phases leave of it (``untracked_s``: the two
  statements' own latency);
- ``worker_timeline``: per run and worker, the phases summed, the worker's window on the run
  (first claim to last result) and its device's ``timing_share`` (timing over the window);
- ``run_timeline``: per run, the same summed over its workers; ``timing_share`` is the timing
  of every device over the sum of their windows.

``complete_trial``'s signature changes, so the old function is dropped and the new one
created; roles that could execute the old one are granted the new one (as ``tunefleet db
roles`` would).

Revision ID: 0015_timeline
Revises: 0014_ruled_out
Create Date: 2026-12-06 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tunefleet.migrations.functions import Function, create, drop

revision = "0015_timeline"
down_revision = "0014_ruled_out"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

_CHECK_TIMELINE = Function(
    name="_check_timeline",
    args="p_timeline jsonb",
    returns="void",
    volatility="IMMUTABLE",
    definer=False,
    # A worker is untrusted: what it reports of its own time must at least be what the views
    # can add up (known phases, seconds between 0 and a week).
    body="""
DECLARE
  v_key text;
  v_value jsonb;
BEGIN
  IF p_timeline IS NULL THEN
    RETURN;
  END IF;
  IF jsonb_typeof(p_timeline) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'a timeline is a JSON object of seconds per phase';
  END IF;
  FOR v_key, v_value IN SELECT e.key, e.value FROM jsonb_each(p_timeline) AS e LOOP
    IF v_key NOT IN ('wait_codegen', 'codegen', 'prebuild', 'ready', 'handoff',
                     'wait_device', 'setup', 'build', 'validation', 'timing', 'reference',
                     'check', 'device_other', 'report') THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('timeline phase %s is not a known phase', v_key);
    END IF;
    IF jsonb_typeof(v_value) <> 'number' OR v_value::numeric < 0
       OR v_value::numeric > 604800 THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
        'timeline phase %s: %s is not a number of seconds between 0 and 604800',
        v_key, v_value);
    END IF;
  END LOOP;
END
""",
)

COMPLETE_TRIAL = Function(
    name="complete_trial",
    args=(
        "p_worker_id uuid, p_trial_id bigint, p_attempt integer, p_token text, "
        "p_state text, p_error text, p_median_s double precision, p_min_s double precision, "
        "p_samples_s double precision[], p_gflops double precision, "
        "p_gbps double precision, p_flop_count double precision, "
        "p_byte_count double precision, p_protocol jsonb, p_compile_s double precision, "
        "p_validation jsonb, p_versions jsonb, p_code text, p_timeline jsonb"
    ),
    returns="text",
    # Queue rule 4: state change, attempt outcome (and its timeline) and measurement in one
    # statement.
    body="""
#variable_conflict use_column
DECLARE
  v_state text;
  v_done boolean := p_state = 'done';
BEGIN
  PERFORM tunefleet._check_session();
  PERFORM tunefleet._check_timeline(p_timeline);
  IF p_state IS NULL OR p_state NOT IN ('done', 'invalid', 'failed', 'timed_out') THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'completion state must be one of done, invalid, failed, timed_out, got %s',
      coalesce(p_state, 'NULL'));
  END IF;
  IF v_done <> (p_median_s IS NOT NULL OR p_samples_s IS NOT NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'a measurement goes with state done and only with it';
  END IF;
  IF v_done THEN
    PERFORM tunefleet._check_measurement(p_median_s, p_min_s, p_samples_s, p_gflops, p_gbps,
                                         p_flop_count, p_byte_count, p_compile_s, p_protocol,
                                         p_validation, p_versions);
  END IF;
  WITH ended AS (
      UPDATE tunefleet.trial t
         SET state = CASE WHEN p_state <> 'failed' OR t.attempt >= t.max_attempts THEN p_state
                          WHEN r.state = 'running' THEN 'pending'
                          ELSE 'cancelled' END,
             lease_owner = CASE WHEN p_state = 'failed' AND t.attempt < t.max_attempts
                                THEN NULL ELSE t.lease_owner END,
             finished_at = CASE WHEN p_state = 'failed' AND t.attempt < t.max_attempts
                                 AND r.state = 'running'
                                THEN NULL ELSE now() END,
             lease_expires_at = NULL,
             lease_token_hash = NULL,
             error = p_error
        FROM tunefleet.run r
       WHERE t.id = p_trial_id AND t.attempt = p_attempt AND r.id = t.run_id
         AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(p_token, 'UTF8'))
   RETURNING t.id, t.run_id, t.attempt, t.state, t.config, t.config_hash,
             r.cache_key, r.problem, r.problem_args
  ), recorded AS (
      UPDATE tunefleet.attempt a
         SET ended_at = now(), outcome = p_state, error = p_error, timeline = p_timeline
        FROM ended e
       WHERE a.trial_id = e.id AND a.attempt = e.attempt
         AND a.worker_id = p_worker_id AND a.ended_at IS NULL
  ), measured AS (
      INSERT INTO tunefleet.measurement
             (trial_id, run_id, attempt, cache_key, config_hash, problem, problem_args,
              config, device_id, worker_id, median_s, min_s, samples_s, gflops, gbps,
              flop_count, byte_count, protocol, compile_s, validation, versions, code, source)
      SELECT e.id, e.run_id, e.attempt, e.cache_key, e.config_hash, e.problem,
             e.problem_args, e.config,
             (SELECT w.device_id FROM tunefleet.worker w WHERE w.id = p_worker_id),
             p_worker_id, p_median_s, p_min_s, p_samples_s, p_gflops, p_gbps, p_flop_count,
             p_byte_count, p_protocol, p_compile_s, coalesce(p_validation, '{}'::jsonb),
             coalesce(p_versions, '{}'::jsonb), p_code, 'measured'
        FROM ended e
       WHERE v_done
  )
  SELECT e.state INTO v_state FROM ended e;
  RETURN v_state;
END
""",
)

COMPLETE_TRIAL_0003 = Function(
    name="complete_trial",
    args=(
        "p_worker_id uuid, p_trial_id bigint, p_attempt integer, p_token text, "
        "p_state text, p_error text, p_median_s double precision, p_min_s double precision, "
        "p_samples_s double precision[], p_gflops double precision, "
        "p_gbps double precision, p_flop_count double precision, "
        "p_byte_count double precision, p_protocol jsonb, p_compile_s double precision, "
        "p_validation jsonb, p_versions jsonb, p_code text"
    ),
    returns="text",
    # Queue rule 4: state change, attempt outcome and measurement in one statement.
    body="""
#variable_conflict use_column
DECLARE
  v_state text;
  v_done boolean := p_state = 'done';
BEGIN
  PERFORM tunefleet._check_session();
  IF p_state IS NULL OR p_state NOT IN ('done', 'invalid', 'failed', 'timed_out') THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'completion state must be one of done, invalid, failed, timed_out, got %s',
      coalesce(p_state, 'NULL'));
  END IF;
  IF v_done <> (p_median_s IS NOT NULL OR p_samples_s IS NOT NULL) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'a measurement goes with state done and only with it';
  END IF;
  IF v_done THEN
    PERFORM tunefleet._check_measurement(p_median_s, p_min_s, p_samples_s, p_gflops, p_gbps,
                                         p_flop_count, p_byte_count, p_compile_s, p_protocol,
                                         p_validation, p_versions);
  END IF;
  WITH ended AS (
      UPDATE tunefleet.trial t
         SET state = CASE WHEN p_state <> 'failed' OR t.attempt >= t.max_attempts THEN p_state
                          WHEN r.state = 'running' THEN 'pending'
                          ELSE 'cancelled' END,
             lease_owner = CASE WHEN p_state = 'failed' AND t.attempt < t.max_attempts
                                THEN NULL ELSE t.lease_owner END,
             finished_at = CASE WHEN p_state = 'failed' AND t.attempt < t.max_attempts
                                 AND r.state = 'running'
                                THEN NULL ELSE now() END,
             lease_expires_at = NULL,
             lease_token_hash = NULL,
             error = p_error
        FROM tunefleet.run r
       WHERE t.id = p_trial_id AND t.attempt = p_attempt AND r.id = t.run_id
         AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(p_token, 'UTF8'))
   RETURNING t.id, t.run_id, t.attempt, t.state, t.config, t.config_hash,
             r.cache_key, r.problem, r.problem_args
  ), recorded AS (
      UPDATE tunefleet.attempt a
         SET ended_at = now(), outcome = p_state, error = p_error
        FROM ended e
       WHERE a.trial_id = e.id AND a.attempt = e.attempt
         AND a.worker_id = p_worker_id AND a.ended_at IS NULL
  ), measured AS (
      INSERT INTO tunefleet.measurement
             (trial_id, run_id, attempt, cache_key, config_hash, problem, problem_args,
              config, device_id, worker_id, median_s, min_s, samples_s, gflops, gbps,
              flop_count, byte_count, protocol, compile_s, validation, versions, code, source)
      SELECT e.id, e.run_id, e.attempt, e.cache_key, e.config_hash, e.problem,
             e.problem_args, e.config,
             (SELECT w.device_id FROM tunefleet.worker w WHERE w.id = p_worker_id),
             p_worker_id, p_median_s, p_min_s, p_samples_s, p_gflops, p_gbps, p_flop_count,
             p_byte_count, p_protocol, p_compile_s, coalesce(p_validation, '{}'::jsonb),
             coalesce(p_versions, '{}'::jsonb), p_code, 'measured'
        FROM ended e
       WHERE v_done
  )
  SELECT e.state INTO v_state FROM ended e;
  RETURN v_state;
END
""",
)

# Frozen copies of the views as this revision creates them (schema.VIEWS may move on), in
# creation order (dependencies first).
VIEWS = {
    "timeline": """
SELECT t.run_id,
       a.trial_id,
       a.attempt,
       t.purpose,
       a.worker_id,
       a.outcome,
       a.claimed_at,
       a.ended_at,
       extract(epoch FROM a.claimed_at
                          - coalesce((SELECT max(p.ended_at) FROM tunefleet.attempt p
                                       WHERE p.trial_id = a.trial_id AND p.id < a.id),
                                     t.created_at))::float8 AS queued_s,
       extract(epoch FROM a.ended_at - a.claimed_at)::float8 AS wall_s,
       coalesce((a.timeline ->> 'wait_codegen')::float8, 0) AS wait_codegen_s,
       coalesce((a.timeline ->> 'codegen')::float8, 0) AS codegen_s,
       coalesce((a.timeline ->> 'prebuild')::float8, 0) AS prebuild_s,
       coalesce((a.timeline ->> 'ready')::float8, 0) AS ready_s,
       coalesce((a.timeline ->> 'handoff')::float8, 0) AS handoff_s,
       coalesce((a.timeline ->> 'wait_device')::float8, 0) AS wait_device_s,
       coalesce((a.timeline ->> 'setup')::float8, 0) AS setup_s,
       coalesce((a.timeline ->> 'build')::float8, 0) AS build_s,
       coalesce((a.timeline ->> 'validation')::float8, 0) AS validation_s,
       coalesce((a.timeline ->> 'timing')::float8, 0) AS timing_s,
       coalesce((a.timeline ->> 'reference')::float8, 0) AS reference_s,
       coalesce((a.timeline ->> 'check')::float8, 0) AS check_s,
       coalesce((a.timeline ->> 'device_other')::float8, 0) AS device_other_s,
       coalesce((a.timeline ->> 'report')::float8, 0) AS report_s,
       extract(epoch FROM a.ended_at - a.claimed_at)::float8
         - (SELECT coalesce(sum(e.value::float8), 0)
              FROM jsonb_each_text(a.timeline) AS e) AS untracked_s,
       a.timeline
  FROM tunefleet.attempt a
  JOIN tunefleet.trial t ON t.id = a.trial_id
 WHERE a.timeline IS NOT NULL AND a.ended_at IS NOT NULL
""",
    "worker_timeline": """
SELECT x.run_id,
       x.worker_id,
       count(*) AS attempts,
       extract(epoch FROM max(x.ended_at) - min(x.claimed_at))::float8 AS window_s,
       sum(x.queued_s) AS queued_s,
       sum(x.wall_s) AS wall_s,
       sum(x.wait_codegen_s) AS wait_codegen_s,
       sum(x.codegen_s) AS codegen_s,
       sum(x.prebuild_s) AS prebuild_s,
       sum(x.ready_s) AS ready_s,
       sum(x.handoff_s) AS handoff_s,
       sum(x.wait_device_s) AS wait_device_s,
       sum(x.setup_s) AS setup_s,
       sum(x.build_s) AS build_s,
       sum(x.validation_s) AS validation_s,
       sum(x.timing_s) AS timing_s,
       sum(x.reference_s) AS reference_s,
       sum(x.check_s) AS check_s,
       sum(x.device_other_s) AS device_other_s,
       sum(x.report_s) AS report_s,
       sum(x.untracked_s) AS untracked_s,
       least(sum(x.timing_s)
             / nullif(extract(epoch FROM max(x.ended_at) - min(x.claimed_at))::float8, 0),
             1.0) AS timing_share
  FROM tunefleet.timeline x
 GROUP BY x.run_id, x.worker_id
""",
    "run_timeline": """
SELECT w.run_id,
       count(*) AS workers,
       sum(w.attempts) AS attempts,
       sum(w.window_s) AS window_s,
       sum(w.queued_s) AS queued_s,
       sum(w.wall_s) AS wall_s,
       sum(w.wait_codegen_s) AS wait_codegen_s,
       sum(w.codegen_s) AS codegen_s,
       sum(w.prebuild_s) AS prebuild_s,
       sum(w.ready_s) AS ready_s,
       sum(w.handoff_s) AS handoff_s,
       sum(w.wait_device_s) AS wait_device_s,
       sum(w.setup_s) AS setup_s,
       sum(w.build_s) AS build_s,
       sum(w.validation_s) AS validation_s,
       sum(w.timing_s) AS timing_s,
       sum(w.reference_s) AS reference_s,
       sum(w.check_s) AS check_s,
       sum(w.device_other_s) AS device_other_s,
       sum(w.report_s) AS report_s,
       sum(w.untracked_s) AS untracked_s,
       least(sum(w.timing_s) / nullif(sum(w.window_s), 0), 1.0) AS timing_share
  FROM tunefleet.worker_timeline w
 GROUP BY w.run_id
""",
}

# EXECUTE on the old signature, carried to the new one for every role that had it (and back).
_GRANT_NEW_AS_OLD = """
DO $$
DECLARE
  v_role regrole;
BEGIN
  FOR v_role IN
      SELECT DISTINCT a.grantee::regrole
        FROM pg_proc p, aclexplode(p.proacl) a
       WHERE p.oid = 'tunefleet.complete_trial(uuid, bigint, integer, text, text, text,
                       double precision, double precision, double precision[],
                       double precision, double precision, double precision,
                       double precision, jsonb, double precision, jsonb, jsonb,
                       text)'::regprocedure
         AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION tunefleet.complete_trial(uuid, bigint, '
                   'integer, text, text, text, double precision, double precision, '
                   'double precision[], double precision, double precision, '
                   'double precision, double precision, jsonb, double precision, jsonb, '
                   'jsonb, text, jsonb) TO %s', v_role);
  END LOOP;
END
$$
"""
_GRANT_OLD_AS_NEW = """
DO $$
DECLARE
  v_role regrole;
BEGIN
  FOR v_role IN
      SELECT DISTINCT a.grantee::regrole
        FROM pg_proc p, aclexplode(p.proacl) a
       WHERE p.oid = 'tunefleet.complete_trial(uuid, bigint, integer, text, text, text,
                       double precision, double precision, double precision[],
                       double precision, double precision, double precision,
                       double precision, jsonb, double precision, jsonb, jsonb, text,
                       jsonb)'::regprocedure
         AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION tunefleet.complete_trial(uuid, bigint, '
                   'integer, text, text, text, double precision, double precision, '
                   'double precision[], double precision, double precision, '
                   'double precision, double precision, jsonb, double precision, jsonb, '
                   'jsonb, text) TO %s', v_role);
  END LOOP;
END
$$
"""


def upgrade() -> None:
    op.add_column(
        "attempt", sa.Column("timeline", postgresql.JSONB(), nullable=True), schema=SCHEMA
    )
    create([_CHECK_TIMELINE, COMPLETE_TRIAL])
    op.execute(_GRANT_NEW_AS_OLD)
    drop([COMPLETE_TRIAL_0003])
    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {SCHEMA}.{name} AS {body}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{name}")
    create([COMPLETE_TRIAL_0003])
    op.execute(_GRANT_OLD_AS_NEW)
    drop([COMPLETE_TRIAL, _CHECK_TIMELINE])
    op.drop_column("attempt", "timeline", schema=SCHEMA)
