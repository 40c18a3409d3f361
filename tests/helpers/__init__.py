"""Helpers shared by tests: plain-SQL data setup and waiting on conditions."""
