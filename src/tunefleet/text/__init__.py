"""What tunefleet prints, shared by the command line, the Python API and the dashboard:
value formatting and tables (:mod:`.output`), report texts for runs, bests and status
(:mod:`.render`), the live progress line with its reader (:mod:`.progress`) and the
one way a whole line is written (:mod:`.lines`).

Sits above :mod:`tunefleet.options` (a reproduce command is a command line) and the queries;
never imports ``tunefleet.cli``.
"""
