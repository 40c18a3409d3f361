"""Alembic environment and versions: the only way DDL reaches a tunefleet database.

Revision ids are readable (``0001_initial``, ``0002_...``) and there is exactly one head.
"""

#: The one head, for the processes that only check a database against it (every worker and
#: each of its children, every command): comparing with this spares them loading Alembic and
#: SQLAlchemy. A new migration updates it; tests/integration/test_head_check.py says so if not.
HEAD = "0013_cold_confirmation"
