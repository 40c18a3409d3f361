"""tunefleet: distributed autotuning of loopy (OpenCL) kernels through one PostgreSQL database.

This package is the shared core that both ``tunefleet.coordinator`` and ``tunefleet.worker``
import: settings, errors, the database (schema, engine, every SQL statement), the
parameter-space DSL, the problem registry, the embedded database and the CLI. The layout and
the rule at each boundary: docs/layout.md.
"""

__version__ = "0.1.0"
