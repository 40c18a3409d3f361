-- The current definition of every function in the tunefleet schema: the functions through
-- which an untrusted worker writes (SECURITY DEFINER, search_path pinned) and the internal
-- helpers they call, each as the newest revision that (re)defined it left it ("as of ...").
--
-- Read, not run. DDL reaches a database only through the migrations (migrations/versions/),
-- and each revision carries its own frozen copy of the bodies it installs. This file is the
-- same truth in one readable place, and it is checked:
-- tests/integration/test_functions_sql.py, on a database migrated to head, drops the schema's
-- functions inside a transaction, runs this file, compares every function's
-- pg_get_functiondef (arguments, result, language, volatility, security, settings, the body
-- byte for byte), its signature and its privileges with what the migrations made, and rolls
-- back. A body that drifts, a function missing here or one too many fails it.
--
-- Decided: migrations never read this file. A revision is history; one that read its bodies
-- from here would install something else each time this file changed (two databases at the
-- same revision would differ, and a downgrade would restore the wrong bodies). To change a
-- function: edit it here, then write a new revision that installs the same body with
-- migrations/functions.py's create() (it emits exactly the statements below: the header, the
-- body between $fn$ quotes, REVOKE ALL ... FROM PUBLIC) and restores the old one in its
-- downgrade; a new worker-callable function also goes into tunefleet.db.roles.WORKER_FUNCTIONS.
-- The test fails until this file and the migrations agree.
--
-- create() puts a body on lines of its own, so a body its revision wrote as a block of lines
-- starts and ends with an empty line here: PostgreSQL keeps a body exactly as given. The
-- headers are laid out for reading: the test compares PostgreSQL's rendering of them, not
-- their text.

-- ============================================================================================
-- Internal helpers (SECURITY INVOKER: they run as the definer function that calls them, under
-- its pinned search_path; nobody is granted EXECUTE on them)
-- ============================================================================================

-- _new_secret (as of 0003_worker_functions)
-- A version-4 UUID from the server's strong random source: 122 random bits.
CREATE OR REPLACE FUNCTION tunefleet._new_secret() RETURNS text
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $fn$
SELECT gen_random_uuid()::text
$fn$;
REVOKE ALL ON FUNCTION tunefleet._new_secret() FROM PUBLIC;

-- _check_session (as of 0003_worker_functions)
-- PostgreSQL lets any session change its own statement_timeout and
-- idle_in_transaction_session_timeout, and a SET clause on a function does not bound the
-- statement that calls it (the timer is armed when that statement starts). So the queue's
-- functions refuse to run for a session whose limits are above (or off) what its login role is
-- given by `tunefleet db roles` (the role-wide defaults, rolconfig). A role without such a
-- default is not held. Values are milliseconds without a unit as stored, or with one ('30s',
-- '1min') as current_setting shows them.
CREATE OR REPLACE FUNCTION tunefleet._check_session() RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
AS $fn$

DECLARE
  v_item text;
  v_name text;
  v_value text;
  v_allowed bigint;
  v_current bigint;
BEGIN
  FOREACH v_item IN ARRAY coalesce(
      (SELECT r.rolconfig FROM pg_roles r WHERE r.rolname = session_user), '{}') LOOP
    v_name := split_part(v_item, '=', 1);
    CONTINUE WHEN v_name NOT IN ('statement_timeout', 'idle_in_transaction_session_timeout');
    v_value := substr(v_item, strpos(v_item, '=') + 1);
    v_allowed := CASE WHEN v_value ~ '^[0-9]+$' THEN v_value::bigint
                      ELSE (extract(epoch FROM v_value::interval) * 1000)::bigint END;
    CONTINUE WHEN v_allowed <= 0;
    v_value := current_setting(v_name);
    v_current := CASE WHEN v_value ~ '^[0-9]+$' THEN v_value::bigint
                      ELSE (extract(epoch FROM v_value::interval) * 1000)::bigint END;
    IF v_current = 0 OR v_current > v_allowed THEN
      RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
        '%s of this session is %s, above the %s ms role %s is given; the queue''s '
        'functions refuse sessions that raised it: connect with at most that much '
        '(TUNEFLEET_STATEMENT_TIMEOUT_MS / TUNEFLEET_IDLE_TX_TIMEOUT_MS)',
        v_name, v_value, v_allowed, session_user);
    END IF;
  END LOOP;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet._check_session() FROM PUBLIC;

-- _check_worker (as of 0003_worker_functions)
-- The caller is a registered worker and holds its secret (only its SHA-256 is stored).
CREATE OR REPLACE FUNCTION tunefleet._check_worker(p_worker_id uuid, p_secret text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
AS $fn$

BEGIN
  IF NOT EXISTS (SELECT 1 FROM tunefleet.worker w
                  WHERE w.id = p_worker_id
                    AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'))) THEN
    RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
      'worker %s is not registered with this secret; a worker process registers itself '
      'and uses the secret it got back', p_worker_id);
  END IF;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet._check_worker(uuid, text) FROM PUBLIC;

-- _check_measurement (as of 0003_worker_functions)
-- What a completion may write as a measurement: positive finite times, at least one sample,
-- finite non-negative rates and counts, JSON objects. NaN compares above infinity in
-- PostgreSQL, so "x < 'Infinity'" also refuses NaN. The plain test comes first: the messages
-- are only formatted for a measurement refused.
CREATE OR REPLACE FUNCTION tunefleet._check_measurement(
    p_median_s double precision, p_min_s double precision, p_samples_s double precision[],
    p_gflops double precision, p_gbps double precision, p_flop_count double precision,
    p_byte_count double precision, p_compile_s double precision, p_protocol jsonb,
    p_validation jsonb, p_versions jsonb
) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
AS $fn$

DECLARE
  v_bad text;
BEGIN
  IF coalesce(p_median_s > 0 AND p_median_s < 'Infinity'
              AND p_min_s > 0 AND p_min_s < 'Infinity'
              AND cardinality(p_samples_s) > 0
              AND NOT EXISTS (SELECT 1 FROM unnest(p_samples_s) AS s(v)
                               WHERE NOT coalesce(s.v > 0 AND s.v < 'Infinity', false))
              AND coalesce(p_gflops >= 0 AND p_gflops < 'Infinity', true)
              AND coalesce(p_gbps >= 0 AND p_gbps < 'Infinity', true)
              AND coalesce(p_flop_count >= 0 AND p_flop_count < 'Infinity', true)
              AND coalesce(p_byte_count >= 0 AND p_byte_count < 'Infinity', true)
              AND coalesce(p_compile_s >= 0 AND p_compile_s < 'Infinity', true)
              AND jsonb_typeof(p_protocol) = 'object'
              AND coalesce(jsonb_typeof(p_validation), 'object') = 'object'
              AND coalesce(jsonb_typeof(p_versions), 'object') = 'object', false) THEN
    RETURN;
  END IF;
  SELECT f.what INTO v_bad
    FROM (VALUES
      (1, NOT coalesce(p_median_s > 0 AND p_median_s < 'Infinity', false),
       format('median_s=%s is not a positive finite number of seconds', p_median_s)),
      (2, NOT coalesce(p_min_s > 0 AND p_min_s < 'Infinity', false),
       format('min_s=%s is not a positive finite number of seconds', p_min_s)),
      (3, coalesce(cardinality(p_samples_s), 0) = 0, 'no timing samples'),
      (4, EXISTS (SELECT 1 FROM unnest(p_samples_s) AS s(v)
                   WHERE NOT coalesce(s.v > 0 AND s.v < 'Infinity', false)),
       'a timing sample is not a positive finite number of seconds'),
      (5, NOT coalesce(p_gflops >= 0 AND p_gflops < 'Infinity', true),
       format('gflops=%s is not a finite number >= 0', p_gflops)),
      (6, NOT coalesce(p_gbps >= 0 AND p_gbps < 'Infinity', true),
       format('gbps=%s is not a finite number >= 0', p_gbps)),
      (7, NOT coalesce(p_flop_count >= 0 AND p_flop_count < 'Infinity', true),
       format('flop_count=%s is not a finite number >= 0', p_flop_count)),
      (8, NOT coalesce(p_byte_count >= 0 AND p_byte_count < 'Infinity', true),
       format('byte_count=%s is not a finite number >= 0', p_byte_count)),
      (9, NOT coalesce(p_compile_s >= 0 AND p_compile_s < 'Infinity', true),
       format('compile_s=%s is not a finite number of seconds >= 0', p_compile_s)),
      (10, coalesce(jsonb_typeof(p_protocol), '') <> 'object',
       'the protocol is not a JSON object'),
      (11, coalesce(jsonb_typeof(p_validation), 'object') <> 'object',
       'the validation verdict is not a JSON object'),
      (12, coalesce(jsonb_typeof(p_versions), 'object') <> 'object',
       'the versions are not a JSON object')
    ) AS f(n, bad, what)
   WHERE f.bad
   ORDER BY f.n
   LIMIT 1;
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'measurement refused: ' || v_bad;
  END IF;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet._check_measurement(
    double precision, double precision, double precision[], double precision, double precision,
    double precision, double precision, double precision, jsonb, jsonb, jsonb
) FROM PUBLIC;

-- _check_timeline (as of 0015_timeline)
-- A worker is untrusted: what it reports of its own time must at least be what the views can
-- add up (known phases, seconds between 0 and a week).
CREATE OR REPLACE FUNCTION tunefleet._check_timeline(p_timeline jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet._check_timeline(jsonb) FROM PUBLIC;

-- ============================================================================================
-- What the worker role may call (SECURITY DEFINER, search_path pinned; EXECUTE granted by
-- `tunefleet db roles`, from tunefleet.db.roles.WORKER_FUNCTIONS)
-- ============================================================================================

-- register_device (as of 0003_worker_functions)
-- A known fingerprint keeps the details it was first registered with: a worker may not rewrite
-- what others registered.
CREATE OR REPLACE FUNCTION tunefleet.register_device(
    p_fingerprint text, p_device_class text, p_platform text, p_vendor text, p_name text,
    p_driver_version text, p_compute_units integer, p_global_mem_bytes bigint, p_details jsonb
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

DECLARE
  v_id bigint;
BEGIN
  PERFORM tunefleet._check_session();
  INSERT INTO tunefleet.device AS d
         (fingerprint, device_class, platform, vendor, name, driver_version, compute_units,
          global_mem_bytes, details)
  VALUES (p_fingerprint, p_device_class, p_platform, p_vendor, p_name, p_driver_version,
          p_compute_units, p_global_mem_bytes, coalesce(p_details, '{}'::jsonb))
  ON CONFLICT (fingerprint) DO NOTHING
  RETURNING d.id INTO v_id;
  IF v_id IS NULL THEN
    SELECT d.id INTO v_id FROM tunefleet.device d WHERE d.fingerprint = p_fingerprint;
  END IF;
  RETURN v_id;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.register_device(
    text, text, text, text, text, text, integer, bigint, jsonb
) FROM PUBLIC;

-- register_worker (as of 0003_worker_functions)
-- Returns the worker secret; only its hash is stored. A taken id fails (primary key).
CREATE OR REPLACE FUNCTION tunefleet.register_worker(
    p_worker_id uuid, p_host text, p_pid integer, p_device_id bigint, p_device_class text,
    p_version text, p_capacity integer
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

DECLARE
  v_secret text := tunefleet._new_secret();
BEGIN
  PERFORM tunefleet._check_session();
  INSERT INTO tunefleet.worker
         (id, host, pid, device_id, device_class, version, capacity, secret_hash)
  VALUES (p_worker_id, p_host, p_pid, p_device_id, p_device_class, p_version, p_capacity,
          sha256(convert_to(v_secret, 'UTF8')));
  RETURN v_secret;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.register_worker(
    uuid, text, integer, bigint, text, text, integer
) FROM PUBLIC;

-- heartbeat_worker (as of 0003_worker_functions)
-- The worker's own heartbeat (its row only, proven by its secret); false: the row is stopped.
CREATE OR REPLACE FUNCTION tunefleet.heartbeat_worker(
    p_worker_id uuid, p_secret text
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

BEGIN
  PERFORM tunefleet._check_session();
  UPDATE tunefleet.worker w SET heartbeat_at = now()
   WHERE w.id = p_worker_id AND w.state = 'active'
     AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'));
  RETURN FOUND;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.heartbeat_worker(uuid, text) FROM PUBLIC;

-- stop_worker (as of 0011_fleet_shape)
-- A worker that stops marks its own row stopped and gives its device back.
CREATE OR REPLACE FUNCTION tunefleet.stop_worker(
    p_worker_id uuid, p_secret text
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.stop_worker(uuid, text) FROM PUBLIC;

-- report_worker_sizing (as of 0003_worker_functions)
-- 0005_worker_sizing's statement. The capacity sizes the coordinator's queue, so it is bounded
-- like a claim (1 + at most 1,000 prefetched). Returns the live workers of the host (NULL when
-- the row is stopped).
CREATE OR REPLACE FUNCTION tunefleet.report_worker_sizing(
    p_worker_id uuid, p_secret text, p_capacity integer, p_prepare_workers integer,
    p_prefetch integer, p_sizing text, p_device_busy double precision,
    p_peer_alive_s double precision
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

DECLARE
  v_peers integer;
BEGIN
  PERFORM tunefleet._check_session();
  IF p_capacity IS NULL OR p_capacity < 1 OR p_capacity > 1001 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('capacity %s is not between 1 and 1001', p_capacity);
  END IF;
  UPDATE tunefleet.worker w
     SET capacity = p_capacity, prepare_workers = p_prepare_workers, prefetch = p_prefetch,
         sizing = p_sizing, device_busy = p_device_busy
   WHERE w.id = p_worker_id AND w.state = 'active'
     AND w.secret_hash = sha256(convert_to(p_secret, 'UTF8'))
  RETURNING (SELECT count(*) FROM tunefleet.worker o
              WHERE o.host = w.host AND o.state = 'active'
                AND (o.id = w.id
                     OR o.heartbeat_at > now() - make_interval(secs => p_peer_alive_s)))
    INTO v_peers;
  RETURN v_peers;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.report_worker_sizing(
    uuid, text, integer, integer, integer, text, double precision, double precision
) FROM PUBLIC;

-- claim_trials (as of 0013_cold_confirmation)
-- Queue rule 1: one index walk per class (LATERAL), SKIP LOCKED, merged in priority, id order,
-- stepping over the runs the worker stands aside from and the trials whose claim the database
-- refused; the row locks end with the calling statement. Each claimed trial gets a random lease
-- token, stored only as its SHA-256. A confirmation's protocol says cold_build: the worker builds
-- and times it in a fresh process that shares no cache with the search.
CREATE OR REPLACE FUNCTION tunefleet.claim_trials(
    p_worker_id uuid, p_secret text, p_classes text[], p_limit integer,
    p_lease_s double precision, p_excluded_runs bigint[], p_skipped_trials bigint[],
    p_alive_s double precision
) RETURNS TABLE (
    trial_id bigint, run_id bigint, attempt integer, max_attempts integer, config jsonb,
    config_hash text, timeout_s double precision, device_class text, problem text,
    problem_args jsonb, protocol jsonb, cache_key text, lease_token text
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.claim_trials(
    uuid, text, text[], integer, double precision, bigint[], bigint[], double precision
) FROM PUBLIC;

-- heartbeat_trials (as of 0010_lease_lock_order)
-- Queue rule 3, for the trials the worker holds (lease token per trial). The held rows are
-- locked first, in trial id order (SELECT ... ORDER BY id FOR NO KEY UPDATE: the row locking
-- sits above the sort, so the order is the sort's whatever the plan): a worker's heartbeat and
-- its release at shutdown lock the same rows in one order and cannot deadlock
-- (0010_lease_lock_order).
CREATE OR REPLACE FUNCTION tunefleet.heartbeat_trials(
    p_worker_id uuid, p_trials bigint[], p_attempts integer[], p_tokens text[],
    p_lease_s double precision
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.heartbeat_trials(
    uuid, bigint[], integer[], text[], double precision
) FROM PUBLIC;

-- take_device (as of 0011_fleet_shape)
-- Queue rule 7 as a leased row: the device of the worker's own rows (host, fingerprint) and
-- index, taken when free, expired, held by a stopped worker or already this worker's.
CREATE OR REPLACE FUNCTION tunefleet.take_device(
    p_worker_id uuid, p_secret text, p_device_index integer, p_lease_s double precision
) RETURNS TABLE (taken boolean, holder uuid, holder_pid integer, holder_expires_in_s double precision)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.take_device(uuid, text, integer, double precision) FROM PUBLIC;

-- heartbeat (as of 0011_fleet_shape)
-- Queue rule 3 in one statement: the held trials (fenced by their tokens, locked in trial id
-- order), the worker row (by its secret), then its device lease; which trials were kept.
CREATE OR REPLACE FUNCTION tunefleet.heartbeat(
    p_worker_id uuid, p_secret text, p_trials bigint[], p_attempts integer[], p_tokens text[], p_lease_s double precision
) RETURNS TABLE (alive boolean, devices integer, kept bigint[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.heartbeat(uuid, text, bigint[], integer[], text[], double precision) FROM PUBLIC;

-- complete_trial (as of 0015_timeline)
-- Queue rule 4: state change, attempt outcome (and its timeline) and measurement in one
-- statement, fenced by trial, attempt, lease owner, state and lease token; every identity
-- column of the measurement is copied from the database's own rows.
CREATE OR REPLACE FUNCTION tunefleet.complete_trial(
    p_worker_id uuid, p_trial_id bigint, p_attempt integer, p_token text, p_state text,
    p_error text, p_median_s double precision, p_min_s double precision,
    p_samples_s double precision[], p_gflops double precision, p_gbps double precision,
    p_flop_count double precision, p_byte_count double precision, p_protocol jsonb,
    p_compile_s double precision, p_validation jsonb, p_versions jsonb, p_code text,
    p_timeline jsonb
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.complete_trial(
    uuid, bigint, integer, text, text, text, double precision, double precision,
    double precision[], double precision, double precision, double precision, double precision,
    jsonb, double precision, jsonb, jsonb, text, jsonb
) FROM PUBLIC;

-- release_trials (as of 0010_lease_lock_order)
-- Hands held trials back (pending again, or cancelled when their run stopped), the attempt not
-- counted; rows locked in trial id order, as in heartbeat_trials (0010_lease_lock_order).
CREATE OR REPLACE FUNCTION tunefleet.release_trials(
    p_worker_id uuid, p_trials bigint[], p_attempts integer[], p_tokens text[], p_reason text
) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

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

$fn$;
REVOKE ALL ON FUNCTION tunefleet.release_trials(
    uuid, bigint[], integer[], text[], text
) FROM PUBLIC;

-- stand_aside (as of 0003_worker_functions)
-- One row per worker and run, the first reason kept (0004_stand_aside's statement).
CREATE OR REPLACE FUNCTION tunefleet.stand_aside(
    p_worker_id uuid, p_secret text, p_run_id bigint, p_reason text
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

BEGIN
  PERFORM tunefleet._check_session();
  PERFORM tunefleet._check_worker(p_worker_id, p_secret);
  INSERT INTO tunefleet.stand_aside (worker_id, run_id, reason)
  VALUES (p_worker_id, p_run_id, p_reason)
  ON CONFLICT (worker_id, run_id) DO NOTHING;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.stand_aside(uuid, text, bigint, text) FROM PUBLIC;

-- reap_expired_leases (as of 0003_worker_functions)
-- Queue rule 5: any caller may reap, one at a time (a transaction-level advisory lock, held
-- until the calling statement ends); only expired leases are touched.
CREATE OR REPLACE FUNCTION tunefleet.reap_expired_leases(
    p_limit integer
) RETURNS TABLE (
    busy boolean, trial_id bigint, attempt integer, previous_owner uuid, state text
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$

#variable_conflict use_column
BEGIN
  PERFORM tunefleet._check_session();
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('reaper limit %s is not between 1 and 10000', p_limit);
  END IF;
  IF NOT pg_try_advisory_xact_lock(hashtextextended('tunefleet:reaper', 0)) THEN
    RETURN QUERY SELECT true, NULL::bigint, NULL::integer, NULL::uuid, NULL::text;
    RETURN;
  END IF;
  RETURN QUERY
  WITH expired AS (
      SELECT t.id, t.run_id, t.attempt, t.max_attempts, t.lease_owner
        FROM tunefleet.trial t
       WHERE t.state = 'running' AND t.lease_expires_at < now()
       ORDER BY t.lease_expires_at
       LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), counted AS (
      SELECT e.id, e.attempt, e.lease_owner,
             1 + (SELECT count(*) FROM tunefleet.attempt a
                   WHERE a.trial_id = e.id AND a.outcome = 'lease_expired') AS expiries,
             CASE WHEN e.attempt >= e.max_attempts THEN 'failed'
                  WHEN r.state = 'running' THEN 'pending'
                  ELSE 'cancelled' END AS next_state
        FROM expired e
        JOIN tunefleet.run r ON r.id = e.run_id
  ), requeued AS (
      UPDATE tunefleet.trial t
         SET state = c.next_state,
             lease_owner = CASE WHEN c.next_state = 'failed' THEN t.lease_owner END,
             finished_at = CASE WHEN c.next_state <> 'pending' THEN now() END,
             lease_expires_at = NULL,
             lease_token_hash = NULL,
             error = CASE WHEN c.next_state = 'failed'
                          THEN format('lease expired %s times', c.expiries)
                          ELSE format('lease expired on attempt %s', t.attempt) END
        FROM counted c
       WHERE t.id = c.id
   RETURNING t.id, t.state, c.attempt, c.lease_owner
  ), recorded AS (
      UPDATE tunefleet.attempt a
         SET ended_at = now(), outcome = 'lease_expired',
             error = 'lease expired (worker stopped heartbeating)'
        FROM requeued q
       WHERE a.trial_id = q.id AND a.attempt = q.attempt
         AND a.worker_id = q.lease_owner AND a.ended_at IS NULL
  )
  SELECT false, q.id, q.attempt, q.lease_owner, q.state FROM requeued q ORDER BY q.id;
END

$fn$;
REVOKE ALL ON FUNCTION tunefleet.reap_expired_leases(integer) FROM PUBLIC;
