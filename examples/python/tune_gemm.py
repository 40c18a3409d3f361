"""Tune a 256^3 GEMM on this machine's OpenCL device (PoCL's CPU device will do) for 20
trials and print the best configuration.

    python examples/python/tune_gemm.py

The results stay in tunefleet's embedded database: `tunefleet runs`, `tunefleet best RUN`.
"""

import tunefleet

result = tunefleet.tune("gemm", sizes={"m": 256, "n": 256, "k": 256}, max_trials=20)
print(f"run {result.run_id} ({result.stop_reason}): best configuration {result.config}")
print(f"reproduce: {result.reproduce}")
