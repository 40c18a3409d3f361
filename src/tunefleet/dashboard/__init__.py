"""``tunefleet dashboard``: a read-only live web page over the database's views.

:mod:`tunefleet.dashboard.settings` holds its settings, :mod:`tunefleet.dashboard.server` the
HTTP server (the standard library's threading server: nothing to install on an offline
cluster), ``static/`` the page, its script and style sheet (shipped in the wheel; no CDN).
Every statement it runs is in :mod:`tunefleet.queries.dashboard` and reads views only, so the
reader role is enough. It never imports the worker or the coordinator, nor OpenCL.
"""
