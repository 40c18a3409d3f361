"""Statements behind ``tunefleet feinsum import`` and ``tunefleet feinsum
export``: imported archive rows become measurements, and a run's measurements are read
back for writing an archive.

The import runs in one transaction: :func:`lock_imports` first, then device upserts, then one
:func:`insert_imported` statement, so a failed import leaves nothing behind and two imports of
the same archive at once cannot both insert a row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tunefleet.devices import DeviceInfo

Row = dict[str, Any]
Conn = psycopg.Connection[Any]


def lock_imports(conn: Conn) -> None:
    """Serialise imports: a transaction-scoped advisory lock, released at commit/rollback.

    Locks no rows; waits while another import holds the lock."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('tunefleet.import-feinsum'))")


def upsert_device(conn: Conn, info: DeviceInfo, device_class: str) -> int:
    """The id of the ``device`` row with this fingerprint, inserting it when new.

    Takes a row lock on the (new or existing) device row until the transaction ends; the
    conflict update touches only ``fingerprint`` (to itself) so it changes nothing."""
    row = conn.execute(
        """
        INSERT INTO tunefleet.device
               (fingerprint, device_class, platform, vendor, name, driver_version, details)
        VALUES (%(fingerprint)s, %(device_class)s, %(platform)s, %(vendor)s, %(name)s,
                %(driver_version)s, %(details)s)
        ON CONFLICT (fingerprint) DO UPDATE SET fingerprint = EXCLUDED.fingerprint
        RETURNING id
        """,
        {
            "fingerprint": info.fingerprint,
            "device_class": device_class,
            "platform": info.platform,
            "vendor": info.vendor,
            "name": info.name,
            "driver_version": info.driver_version,
            "details": Jsonb(info.extra),
        },
    ).fetchone()
    assert row is not None
    return int(row["id"] if isinstance(row, dict) else row[0])


def insert_imported(conn: Conn, rows: Sequence[Row]) -> int:
    """Insert imported measurements (``source = 'imported'``, no trial, no run) unless the
    same archive fact (``versions->'feinsum_fact'->>'row_key'``) is already there for the
    same cache key and configuration; duplicates within ``rows`` collapse too. Returns the
    number inserted.

    One statement; reads existing measurements through ``measurement_cache_idx`` and locks
    nothing beyond the new rows (callers hold :func:`lock_imports`)."""
    if not rows:
        return 0
    cur = conn.execute(
        """
        WITH incoming AS (
            SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
                cache_key text, config_hash text, problem text, problem_args jsonb,
                config jsonb, device_id bigint, median_s float8, gflops float8,
                flop_count float8, protocol jsonb, validation jsonb, versions jsonb,
                created_at timestamptz, row_key text)
        ), fresh AS (
            SELECT DISTINCT ON (i.row_key) i.*
              FROM incoming i
             WHERE NOT EXISTS (
                   SELECT 1 FROM tunefleet.measurement m
                    WHERE m.cache_key = i.cache_key
                      AND m.config_hash = i.config_hash
                      AND m.source = 'imported'
                      AND m.versions -> 'feinsum_fact' ->> 'row_key' = i.row_key)
             ORDER BY i.row_key
        )
        INSERT INTO tunefleet.measurement
               (cache_key, config_hash, problem, problem_args, config, device_id,
                median_s, min_s, samples_s, gflops, flop_count, protocol, validation,
                versions, source, created_at)
        SELECT cache_key, config_hash, problem, problem_args, config, device_id,
               median_s, median_s, ARRAY[median_s], gflops, flop_count, protocol,
               validation, versions, 'imported', coalesce(created_at, now())
          FROM fresh
        """,
        {"rows": json.dumps(list(rows))},
    )
    return max(cur.rowcount, 0)


def run_row(conn: Conn, run_id: int) -> Row | None:
    """The ``run`` row, or ``None``. Read-only, no locks."""
    row = conn.execute("SELECT * FROM tunefleet.run WHERE id = %(id)s", {"id": run_id}).fetchone()
    return dict(row) if row is not None else None


def run_measurements(conn: Conn, run_id: int) -> list[Row]:
    """Measurements of the run's finished trials (``done``), with their device's name,
    vendor and driver, in trial order. Read-only, no locks."""
    return [
        dict(r)
        for r in conn.execute(
            """
            SELECT m.id, m.trial_id, m.config, m.median_s, m.min_s, m.flop_count, m.gflops,
                   m.versions, m.protocol, m.created_at,
                   d.name AS device_name, d.vendor AS device_vendor,
                   d.driver_version AS device_driver_version
              FROM tunefleet.trial t
              JOIN tunefleet.measurement m ON m.trial_id = t.id
              LEFT JOIN tunefleet.device d ON d.id = m.device_id
             WHERE t.run_id = %(run_id)s AND t.state = 'done' AND t.purpose = 'search'
             ORDER BY t.id
            """,
            {"run_id": run_id},
        ).fetchall()
    ]
