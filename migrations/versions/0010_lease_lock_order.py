"""lease lock order: heartbeat and release lock the held trial rows in trial id order

``tunefleet.heartbeat_trials`` and ``tunefleet.release_trials`` updated the held rows in
whatever order the plan produced them: a plan cached after a few calls (generic) hashed the
rows and joined them in the order of the arrays (sorted by trial id), a fresh plan walked an
index of running trials (by lease expiry, or by run). A worker's heartbeat (its own session)
and its release at shutdown (the main session) then locked the same rows in opposite orders,
and PostgreSQL aborted one of them as a deadlock. Both now take the row locks first, in a
``SELECT ... ORDER BY id FOR NO KEY UPDATE`` (the lock an UPDATE takes; the row locking sits
above the sort, so the order is the sort's whatever the plan), and update those rows.

Every other statement that waits on trial rows waits on one (``complete_trial``); the claim
and the reaper skip locked rows. Trial rows are always locked before attempt rows.

Revision ID: 0010_lease_lock_order
Revises: 0009_dashboard_views
Create Date: 2026-12-01 22:10:00
"""

from __future__ import annotations

from tunefleet.migrations.functions import Function, create

revision = "0010_lease_lock_order"
down_revision = "0009_dashboard_views"
branch_labels = None
depends_on = None

_HEARTBEAT_ARGS = (
    "p_worker_id uuid, p_trials bigint[], p_attempts integer[], p_tokens text[], "
    "p_lease_s double precision"
)
_RELEASE_ARGS = (
    "p_worker_id uuid, p_trials bigint[], p_attempts integer[], p_tokens text[], p_reason text"
)

HEARTBEAT_TRIALS = Function(
    name="heartbeat_trials",
    args=_HEARTBEAT_ARGS,
    returns="SETOF bigint",
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  RETURN QUERY
  WITH held AS (
      SELECT t.id FROM tunefleet.trial t
        JOIN unnest(p_trials, p_attempts, p_tokens) AS h(id, attempt, token) ON t.id = h.id
       WHERE t.attempt = h.attempt AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(h.token, 'UTF8'))
       ORDER BY t.id
         FOR NO KEY UPDATE OF t
  )
  UPDATE tunefleet.trial t
     SET lease_expires_at = now() + make_interval(secs => p_lease_s)
    FROM held
   WHERE t.id = held.id
  RETURNING t.id;
END
""",
)

RELEASE_TRIALS = Function(
    name="release_trials",
    args=_RELEASE_ARGS,
    returns="SETOF bigint",
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  RETURN QUERY
  WITH held AS (
      SELECT t.id, t.attempt FROM tunefleet.trial t
        JOIN unnest(p_trials, p_attempts, p_tokens) AS h(id, attempt, token) ON t.id = h.id
       WHERE t.attempt = h.attempt AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(h.token, 'UTF8'))
       ORDER BY t.id
         FOR NO KEY UPDATE OF t
  ), given AS (
      UPDATE tunefleet.trial t
         SET state = CASE WHEN r.state = 'running' THEN 'pending' ELSE 'cancelled' END,
             finished_at = CASE WHEN r.state = 'running' THEN NULL ELSE now() END,
             attempt = t.attempt - 1, lease_owner = NULL, lease_expires_at = NULL,
             lease_token_hash = NULL, started_at = NULL
        FROM held, tunefleet.run r
       WHERE t.id = held.id AND r.id = t.run_id
   RETURNING t.id, held.attempt
  ), recorded AS (
      UPDATE tunefleet.attempt a
         SET ended_at = now(), outcome = 'released', error = p_reason
        FROM given g
       WHERE a.trial_id = g.id AND a.attempt = g.attempt
         AND a.worker_id = p_worker_id AND a.ended_at IS NULL
  )
  SELECT g.id FROM given g;
END
""",
)

# 0003_worker_functions' bodies, frozen here for the downgrade.
HEARTBEAT_TRIALS_0003 = Function(
    name="heartbeat_trials",
    args=_HEARTBEAT_ARGS,
    returns="SETOF bigint",
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  RETURN QUERY
  UPDATE tunefleet.trial t
     SET lease_expires_at = now() + make_interval(secs => p_lease_s)
    FROM unnest(p_trials, p_attempts, p_tokens) AS h(id, attempt, token)
   WHERE t.id = h.id AND t.attempt = h.attempt
     AND t.lease_owner = p_worker_id AND t.state = 'running'
     AND t.lease_token_hash = sha256(convert_to(h.token, 'UTF8'))
  RETURNING t.id;
END
""",
)

RELEASE_TRIALS_0003 = Function(
    name="release_trials",
    args=_RELEASE_ARGS,
    returns="SETOF bigint",
    body="""
#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  RETURN QUERY
  WITH given AS (
      UPDATE tunefleet.trial t
         SET state = CASE WHEN r.state = 'running' THEN 'pending' ELSE 'cancelled' END,
             finished_at = CASE WHEN r.state = 'running' THEN NULL ELSE now() END,
             attempt = t.attempt - 1, lease_owner = NULL, lease_expires_at = NULL,
             lease_token_hash = NULL, started_at = NULL
        FROM unnest(p_trials, p_attempts, p_tokens) AS h(id, attempt, token),
             tunefleet.run r
       WHERE t.id = h.id AND t.attempt = h.attempt AND r.id = t.run_id
         AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(h.token, 'UTF8'))
   RETURNING t.id, h.attempt
  ), recorded AS (
      UPDATE tunefleet.attempt a
         SET ended_at = now(), outcome = 'released', error = p_reason
        FROM given g
       WHERE a.trial_id = g.id AND a.attempt = g.attempt
         AND a.worker_id = p_worker_id AND a.ended_at IS NULL
  )
  SELECT g.id FROM given g;
END
""",
)


def upgrade() -> None:
    # CREATE OR REPLACE keeps the grants `tunefleet db roles` gave (same signatures).
    create([HEARTBEAT_TRIALS, RELEASE_TRIALS])


def downgrade() -> None:
    create([HEARTBEAT_TRIALS_0003, RELEASE_TRIALS_0003])
