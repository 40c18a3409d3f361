"""fleet shape: the device lock as a leased row, and one heartbeat statement per beat

A worker held its device with a session-level advisory lock: session state, which a
transaction pooler (PgBouncer ``pool_mode = transaction``) lends to whichever client uses the
server connection next, so behind one two workers "held" one device and a dead worker's lock
never went away. The device is now held as a row of ``tunefleet.device_lease`` with the same
rules as a trial's lease: taken by a registered worker (``tunefleet.take_device``, its secret,
the host and fingerprint copied from its own worker and device rows), kept alive by its
heartbeats on the database clock, gone when the worker stops, and free to another worker once
it expired (the holder stopped heartbeating for a whole lease) or its holder's row is
stopped.

``tunefleet.heartbeat`` is the worker's whole beat in one statement (a beat was two): it
extends the held trials' leases (fenced by their tokens, rows locked in trial id order as
``heartbeat_trials`` does), the worker row's heartbeat and its device lease, and says which
trials it kept and whether the device is still held. One session per worker makes every
statement of a worker a round trip of its own: halving the beat's halves its cost.

``tunefleet.stop_worker`` also gives the device back. Lock order everywhere: trial rows (by
id), then the worker row, then the device lease row.

``worker_host_active_idx``: every sizing report (every worker, every 10 s) counts the live
workers of its host, which read the whole worker table (stopped rows included, one per
worker start ever) without it: at N workers, N/10 such reads a second of N or more rows.

Revision ID: 0011_fleet_shape
Revises: 0010_lease_lock_order
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from tunefleet.migrations.functions import Function, create, drop

revision = "0011_fleet_shape"
down_revision = "0010_lease_lock_order"
branch_labels = None
depends_on = None

SCHEMA = "tunefleet"

TAKE_DEVICE = Function(
    name="take_device",
    args="p_worker_id uuid, p_secret text, p_device_index integer, p_lease_s double precision",
    returns=(
        "TABLE (taken boolean, holder uuid, holder_pid integer, "
        "holder_expires_in_s double precision)"
    ),
    body="""
#variable_conflict use_column
DECLARE
  v_host text;
  v_fingerprint text;
  v_holder uuid;
BEGIN
  PERFORM tunefleet._check_session();
  PERFORM tunefleet._check_worker(p_worker_id, p_secret);
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  SELECT w.host, d.fingerprint INTO v_host, v_fingerprint
    FROM tunefleet.worker w JOIN tunefleet.device d ON d.id = w.device_id
   WHERE w.id = p_worker_id AND w.state = 'active';
  IF v_fingerprint IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
      'worker %s is stopped or registered no device; a device is taken by the active '
      'worker that registered it', p_worker_id);
  END IF;
  INSERT INTO tunefleet.device_lease AS l
         (host, fingerprint, device_index, worker_id, expires_at)
  VALUES (v_host, v_fingerprint, p_device_index, p_worker_id,
          now() + make_interval(secs => p_lease_s))
  ON CONFLICT (host, fingerprint, device_index) DO UPDATE
     SET worker_id = excluded.worker_id, expires_at = excluded.expires_at, taken_at = now()
   WHERE l.worker_id = excluded.worker_id OR l.expires_at < now()
      OR NOT EXISTS (SELECT 1 FROM tunefleet.worker o
                      WHERE o.id = l.worker_id AND o.state = 'active')
  RETURNING l.worker_id INTO v_holder;
  IF v_holder IS NOT NULL THEN
    RETURN QUERY SELECT true, p_worker_id, NULL::integer, NULL::double precision;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT false, l.worker_id, o.pid, extract(epoch FROM l.expires_at - now())::double precision
    FROM tunefleet.device_lease l LEFT JOIN tunefleet.worker o ON o.id = l.worker_id
   WHERE l.host = v_host AND l.fingerprint = v_fingerprint
     AND l.device_index = p_device_index;
END
""",
)

HEARTBEAT = Function(
    name="heartbeat",
    args=(
        "p_worker_id uuid, p_secret text, p_trials bigint[], p_attempts integer[], "
        "p_tokens text[], p_lease_s double precision"
    ),
    returns="TABLE (alive boolean, devices integer, kept bigint[])",
    body="""
#variable_conflict use_column
DECLARE
  v_kept bigint[];
  v_alive boolean;
  v_devices integer := 0;
BEGIN
  PERFORM tunefleet._check_session();
  IF NOT coalesce(p_lease_s > 0 AND p_lease_s <= 86400, false) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('lease of %s s is not between 0 and 86400 s', p_lease_s);
  END IF;
  WITH held AS (
      SELECT t.id FROM tunefleet.trial t
        JOIN unnest(p_trials, p_attempts, p_tokens) AS h(id, attempt, token) ON t.id = h.id
       WHERE t.attempt = h.attempt AND t.lease_owner = p_worker_id AND t.state = 'running'
         AND t.lease_token_hash = sha256(convert_to(h.token, 'UTF8'))
       ORDER BY t.id
         FOR NO KEY UPDATE OF t
  ), extended AS (
      UPDATE tunefleet.trial t
         SET lease_expires_at = now() + make_interval(secs => p_lease_s)
        FROM held
       WHERE t.id = held.id
      RETURNING t.id
  )
  SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}') INTO v_kept FROM extended e;
  UPDATE tunefleet.worker w SET heartbeat_at = now()
   WHERE w.id = p_worker_id AND w.state = 'active'
     AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'));
  v_alive := FOUND;
  IF v_alive THEN
    UPDATE tunefleet.device_lease l
       SET expires_at = now() + make_interval(secs => p_lease_s)
     WHERE l.worker_id = p_worker_id;
    GET DIAGNOSTICS v_devices = ROW_COUNT;
  END IF;
  RETURN QUERY SELECT v_alive, v_devices, v_kept;
END
""",
)

STOP_WORKER = Function(
    name="stop_worker",
    args="p_worker_id uuid, p_secret text",
    returns="boolean",
    body="""
BEGIN
  PERFORM tunefleet._check_session();
  UPDATE tunefleet.worker w
     SET state = 'stopped', stopped_at = now(), heartbeat_at = now()
   WHERE w.id = p_worker_id AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'));
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  DELETE FROM tunefleet.device_lease l WHERE l.worker_id = p_worker_id;
  RETURN true;
END
""",
)

# 0003_worker_functions' body, frozen here for the downgrade.
STOP_WORKER_0003 = Function(
    name="stop_worker",
    args="p_worker_id uuid, p_secret text",
    returns="boolean",
    body="""
BEGIN
  PERFORM tunefleet._check_session();
  UPDATE tunefleet.worker w
     SET state = 'stopped', stopped_at = now(), heartbeat_at = now()
   WHERE w.id = p_worker_id AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'));
  RETURN FOUND;
END
""",
)


def upgrade() -> None:
    op.create_table(
        "device_lease",
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=False),
        sa.Column(
            "worker_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey(f"{SCHEMA}.worker.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "taken_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.PrimaryKeyConstraint("host", "fingerprint", "device_index"),
        schema=SCHEMA,
    )
    # A worker's own lease, found by its heartbeat and its stop.
    op.create_index("device_lease_worker_idx", "device_lease", ["worker_id"], schema=SCHEMA)
    op.create_index(
        "worker_host_active_idx",
        "worker",
        ["host"],
        schema=SCHEMA,
        postgresql_where=sa.text("state = 'active'"),
    )
    create([TAKE_DEVICE, HEARTBEAT, STOP_WORKER])


def downgrade() -> None:
    op.drop_index("worker_host_active_idx", table_name="worker", schema=SCHEMA)
    create([STOP_WORKER_0003])
    drop([TAKE_DEVICE, HEARTBEAT])
    op.drop_index("device_lease_worker_idx", table_name="device_lease", schema=SCHEMA)
    op.drop_table("device_lease", schema=SCHEMA)
