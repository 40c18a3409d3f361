"""Command-line options every front door shares: flag types with their limits
(:mod:`.flags`), problem arguments and their parsing (:mod:`.args`) and the database flags
(:mod:`.db`).

Below the command line (``tunefleet.cli``), the Python API and both components: each builds
its own parsers or settings from these, and none of them imports ``tunefleet.cli``.
"""
