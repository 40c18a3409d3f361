"""The worker: claims trials from the queue, builds and times kernels on one OpenCL device,
and writes results back under a lease. Never imports ``coordinator``.

``cli``        ``tunefleet worker`` / ``python -m tunefleet.worker``: flags -> settings -> run
``settings``   WorkerSettings (lease, timeouts, prefetch, ...) and how defaults are chosen
``loop``       the main loop: start-up, then its named steps and their database I/O
``results``    a held trial; a child's reply and a problem's outcome -> verdict, measurement row
``judge``      the environment-fault policy (suspects, streaks, standing aside): pure decisions
``pool``       the code-generation processes and the books their sizing is decided from
``sizing``     the sizing decisions (cores, memory, pool size, prefetch): pure functions
``signals``    stop requests (SIGTERM, SIGINT, SIGUSR1) and the wake-up pipe
``supervise``  the device process and code-generation processes, deadlines, kills, restarts
``heartbeat``  the heartbeat thread (trial and device leases, one statement on the worker's
               one session), the set of held claims, the main loop's liveness
``wake``       when to claim next (polling with jittered backoff; LISTEN only with --listen)
``link``       the worker's one database connection, shared, reconnecting with backoff
``device``     OpenCL discovery and the device session (used only inside the device process)
``vocabulary`` the worker's trial stages, verdicts and the child processes' reply kinds
"""
