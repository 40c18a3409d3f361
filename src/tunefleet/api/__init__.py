"""The Python API: what ``import tunefleet`` offers a script, the same campaign and the same
reports as the command line (which is built on these functions).

``tune``     (:mod:`~tunefleet.api.tune`) a whole tuning campaign: database, local workers,
             search, progress, clean stop; returns a :class:`~tunefleet.api.tune.TuneResult`
``runs``, ``results``, ``best`` (:mod:`~tunefleet.api.read`) what ``tunefleet runs``,
             ``export`` and ``best`` read, as frozen dataclasses (and DataFrames)
``fleet``    (:mod:`~tunefleet.api.fleet`) this machine's part: device plan, worker processes
``problem_ref`` how a Problem class in the caller's file travels to the workers

Like the CLI, and unlike the rest of the shared core, this package drives the coordinator and
asks the worker's device code what this machine has (imported inside functions only).
"""
