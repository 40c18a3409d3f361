"""The worker: claims trials from the queue, builds and times kernels on one OpenCL device,
and writes results back under a lease. Never imports ``coordinator``."""
