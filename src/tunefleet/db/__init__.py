"""Database access: schema (``schema``), connections (``engine``), migrations (``migrate``)
and the embedded PostgreSQL server (``embedded``). SQL statements live in ``tunefleet.queries``.
"""
