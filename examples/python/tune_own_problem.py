"""Tune a Problem subclass of one's own, defined in stencil_problem.py next to this script.

    python examples/python/tune_own_problem.py

The workers import the class from that file (a class defined in this script itself, in
__main__, could not travel to them, and tune() would say so).
"""

from stencil_problem import Stencil

import tunefleet

result = tunefleet.tune(Stencil, sizes={"n": 8192}, max_trials=12)
print(f"run {result.run_id} ({result.stop_reason}): best configuration {result.config}")
