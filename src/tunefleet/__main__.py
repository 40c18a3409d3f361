import sys

from tunefleet.cli import main

sys.exit(main())
