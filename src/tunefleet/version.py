"""The version of tunefleet, on its own so that modules anywhere below the package's front
(:mod:`tunefleet`, whose ``__init__`` loads the public API on first use) can record it without
importing that front: a measurement stores the version that made it."""

__version__ = "0.1.0"
