"""Alembic environment and versions: the only way DDL reaches a tunefleet database.

Revision ids are readable (``0001_initial``, ``0002_...``) and there is exactly one head.
"""
