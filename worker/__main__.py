"""``python -m tunefleet.worker [flags]``: the same as ``tunefleet worker [flags]``."""

from __future__ import annotations

import sys

from tunefleet.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
