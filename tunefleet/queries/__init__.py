"""Every SQL statement tunefleet runs, one module per concern.

Each statement is a module-level function taking an open psycopg connection; its docstring
states which rows it locks and for how long. Values always travel as bind parameters.

``queue``   claim, heartbeat, fenced completion, release, reaper, worker/device registration
``search``  runs and trial insertion/reading for the coordinator, cache lookups, stop rules
``report``  read-only queries behind the CLI's status/best/export/plot commands
"""
