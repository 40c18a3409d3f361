"""Database access: schema (``schema``), connections (``engine``, a leaf), which database to use
and whether it is at head (``resolve``), migrations (``migrate``), the embedded PostgreSQL
server (``embedded``), roles (``roles``) and poolers (``pooler``). SQL statements live in
``tunefleet.queries``.
"""
