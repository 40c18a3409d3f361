"""Alembic environment and versions: the only way DDL reaches a tunefleet database.

Revision ids are readable (``0001_initial``, ``0002_...``) and there is exactly one head.
"""

# The one head lives below the migrations (tunefleet.db.head), so that the database layer
# never imports this package; it is named here too, beside the versions it must match.
from tunefleet.db.head import HEAD

__all__ = ["HEAD"]
