"""The coordinator: drives the OpenTuner search for a run and feeds the trial queue.
Never imports ``worker`` or pyopencl (it runs on login nodes without OpenCL)."""
