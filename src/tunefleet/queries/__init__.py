"""Every SQL statement tunefleet runs, one module per concern.

Each statement is a module-level function taking an open psycopg connection; its docstring
states which rows it locks and for how long. Values always travel as bind parameters.

``queue``      the worker side: registration, claim, heartbeat, fenced completion, release,
               reaper, standing aside, sizing reports
``search``     the coordinator: runs and their ownership, trial insertion and outcomes, cache
               lookups, warm starts, confirmations
``report``     read-only: the CLI's status, runs, best, show, export and plot commands
``dashboard``  read-only, views only: ``tunefleet dashboard``'s JSON API
``feinsum``    ``tunefleet feinsum import`` / ``feinsum export``
``roles``      ``tunefleet db roles``: roles, passwords, ownership and grants
``capacity``   what sizes a server for a fleet: its settings and sessions (``benchmarks/
               fleet_sim.py``), which server process serves a session (the pooler check)
``bench``      read-only, not used by the product: what the ``benchmarks/`` scripts time a
               fleet with (here because every SQL statement lives in this package)
"""
