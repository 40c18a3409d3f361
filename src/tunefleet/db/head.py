"""The migration head this tunefleet expects its database at.

Here, below the migrations, so that :mod:`tunefleet.db` checks a database without importing
``tunefleet.migrations`` (which imports ``tunefleet.db``: the package graph stays one-way).
Every worker and each of its children, and every command, compares with this and spares
itself loading Alembic and SQLAlchemy. A new migration updates it;
tests/integration/test_head_check.py says so if not.
"""

HEAD = "0017_spread_within"
