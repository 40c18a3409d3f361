"""``tunefleet.runs()``, ``tunefleet.results(run)`` and ``tunefleet.best(run, top=k)``: the
numbers of ``tunefleet runs``, ``tunefleet export`` and ``tunefleet best`` as plain frozen
dataclasses, read through the same statements (:mod:`tunefleet.queries.report`, and
:func:`tunefleet.text.render.read_best`, which adds the reproduce command).

Each returns a :class:`Records` (a tuple) whose :meth:`~Records.to_dataframe` gives a pandas
DataFrame where pandas is installed (it is no dependency of tunefleet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from tunefleet.errors import TunefleetError, UsageError
from tunefleet.vocabulary import BestStatus, TrialState, best_status

T = TypeVar("T")


class Records(tuple[T, ...]):
    """Rows of one kind, in the CLI's order; a tuple with a DataFrame view."""

    __slots__ = ()

    def to_dataframe(self) -> Any:
        """A pandas DataFrame, one row per record and one column per field (needs pandas)."""
        try:
            import pandas
        except ImportError:
            raise TunefleetError(
                "to_dataframe() needs pandas, which tunefleet does not install; "
                "pip install pandas (or use the records as they are)"
            ) from None
        rows = [dataclasses.asdict(r) for r in self]  # type: ignore[call-overload]
        return pandas.DataFrame(rows)


def _from_row(cls: type[T], row: Mapping[str, Any], **extra: Any) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: row.get(k) for k in names if k not in extra}, **extra)


@dataclass(frozen=True)
class RunSummary:
    """One run with its progress counters, as ``tunefleet runs`` lists it."""

    run_id: int
    name: str | None
    problem: str
    problem_args: dict[str, Any]
    device_class: str
    state: str
    stop_reason: str | None
    trials: int
    done: int
    running: int
    pending: int
    invalid: int
    failed: int
    timed_out: int
    cancelled: int
    cached: int
    #: The run's best as every report shows it: its confirmed figures once a cold
    #: re-measurement agreed, else the search's; ``best_status`` says which
    #: (:class:`~tunefleet.vocabulary.BestStatus`: confirmed, not reproduced, unconfirmed).
    best_gflops: float | None
    best_median_s: float | None
    evaluations_per_minute: float
    elapsed_s: float
    created_at: datetime
    finished_at: datetime | None
    max_trials: int | None
    max_seconds: float | None
    target_gflops: float | None
    best_status: str | None = None
    best_trial_id: int | None = None
    #: How many of ``invalid`` the problem's rules rejected before any worker saw them
    #: (they cost no evaluation; ``max_trials`` does not count them).
    ruled_out: int = 0
    #: The share of its devices' time that went to timing kernels (0-1; ``None`` before an
    #: attempt reported its timeline): :mod:`tunefleet.timeline`, the ``run_timeline`` view.
    timing_share: float | None = None


@dataclass(frozen=True)
class TrialResult:
    """One finished trial of a run (the ``results`` view, plus samples, protocol and
    validation), as ``tunefleet export RUN`` writes it."""

    run_id: int
    trial_id: int
    problem: str
    config: dict[str, Any]
    state: str
    source: str
    attempt: int
    error: str | None
    median_s: float | None
    min_s: float | None
    gflops: float | None
    gbps: float | None
    compile_s: float | None
    device_name: str | None
    worker_host: str | None
    started_at: datetime | None
    finished_at: datetime | None
    samples_s: list[float] | None
    protocol: dict[str, Any] | None
    validation: dict[str, Any] | None


@dataclass(frozen=True)
class BestTrial:
    """One of a run's best trials, ranked as ``tunefleet best`` ranks them (by the confirmed
    figure where a re-measurement has one), with the command that reproduces it.
    ``confirm_state`` is the re-measurement's trial state (None: never confirmed)."""

    trial_id: int
    config: dict[str, Any]
    median_s: float
    min_s: float | None
    gflops: float | None
    gbps: float | None
    device_name: str | None
    driver_version: str | None
    confirm_state: str | None
    confirmed_median_s: float | None
    confirmed_gflops: float | None
    spread: float | None
    noise: float | None
    disagrees: bool | None
    reproduce: str
    #: The confirmation criterion's p-value (:mod:`tunefleet.agreement`); the search
    #: measurement's noise (IQR over median) and whether it stayed over its protocol's limit.
    agreement_p: float | None = None
    measured_noise: float | None = None
    noisy: bool | None = None
    #: The re-measurement generated the very code the search measured, and was a cold build
    #: (a fresh process sharing no cache with the search).
    same_source: bool | None = None
    cold_build: bool | None = None
    #: The time it is ranked by: its figure across processes where judged, else the
    #: re-measured median where one finished, else the search's.
    ranked_median_s: float | None = None
    #: The verdict across processes (:mod:`tunefleet.spread`; None until judged): ``agrees``
    #: or ``disagrees``, the figure quoted (the median of its consistent processes' medians)
    #: and how many processes timed it.
    standing: str | None = None
    figure_s: float | None = None
    processes: int | None = None
    #: The run's between-process spread: what a re-measurement must stay within (the ± the
    #: best is quoted with) and the median difference of two processes of one kernel.
    spread_tolerance: float | None = None
    spread_typical: float | None = None
    #: The run's within-process noise (median IQR over median of those processes' samples),
    #: which the tolerance is kept above a multiple of (:mod:`tunefleet.spread`).
    spread_within: float | None = None
    #: The runner-up the run's best could not be told apart from (None: separated).
    unseparated_trial_id: int | None = None
    #: The run's processes differ too much to quote its figures to 15 %
    #: (:func:`tunefleet.spread.imprecise`): every figure of the run carries that warning.
    imprecise: bool | None = None
    #: The fastest and slowest of its processes' medians when one lies beyond the ± it is
    #: quoted with (:func:`tunefleet.spread.process_range`; None: all within it).
    process_range_s: tuple[float, float] | None = None
    #: Its processes' launches, 10th to 90th percentile, when they reach beyond that ± by
    #: more than the floor (:func:`tunefleet.spread.launch_range`; None: within it).
    launch_range_s: tuple[float, float] | None = None

    @property
    def confirmed(self) -> bool:
        """A re-measurement finished and agrees by the confirmation criterion
        (:mod:`tunefleet.agreement`) and built the same code."""
        return self.status == BestStatus.CONFIRMED

    @property
    def status(self) -> BestStatus:
        """confirmed, not reproduced or unconfirmed (:class:`~tunefleet.vocabulary.BestStatus`)."""
        return best_status(self.confirm_state, self.disagrees, self.standing)

    @property
    def headline_gflops(self) -> float | None:
        """The figure to quote: across processes once judged, else the re-measurement's where
        one finished, else the search's."""
        if self.figure_s is not None:
            return None if self.gflops is None else self.gflops * self.median_s / self.figure_s
        return self.confirmed_gflops if self.confirm_state == TrialState.DONE else self.gflops

    @property
    def headline_median_s(self) -> float:
        if self.figure_s is not None:
            return self.figure_s
        if self.confirm_state == TrialState.DONE and self.confirmed_median_s is not None:
            return self.confirmed_median_s
        return self.median_s


def best_trial(row: Mapping[str, Any]) -> BestTrial:
    """A :func:`tunefleet.text.render.read_best` row as a :class:`BestTrial`."""
    return _from_row(BestTrial, row)


@contextmanager
def _open(db: str | None) -> Iterator[Any]:
    from tunefleet.db.resolve import open_db

    with open_db(db) as conn:
        yield conn


def runs(*, db: str | None = None, limit: int | None = None) -> Records[RunSummary]:
    """Every run of the database (``db``, default the embedded one), newest first.

    >>> [r.run_id for r in tunefleet.runs()]    # doctest: +SKIP
    [2, 1]
    """
    from tunefleet.queries import report

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"limit={limit!r}: give a positive whole number")
    with _open(db) as conn:
        rows = report.list_runs(conn, limit=limit)
    return Records(_from_row(RunSummary, r, state=r["run_state"]) for r in rows)


def results(run_id: int, *, db: str | None = None) -> Records[TrialResult]:
    """Every finished trial of run ``run_id`` in trial order (what ``tunefleet export``
    writes); RunError when the run does not exist.

    >>> tunefleet.results(1).to_dataframe()["gflops"].max()    # doctest: +SKIP
    """
    from tunefleet.queries import report
    from tunefleet.text.render import require_run

    _check_id(run_id)
    with _open(db) as conn:
        require_run(conn, run_id)
        rows = report.export_rows(conn, run_id)
    return Records(_from_row(TrialResult, r) for r in rows)


def best(run_id: int, *, top: int = 1, db: str | None = None) -> Records[BestTrial]:
    """The ``top`` best trials of run ``run_id``, best first (empty before a trial
    succeeded); RunError when the run does not exist.

    >>> tunefleet.best(1)[0].config    # doctest: +SKIP
    {'tile': 16, 'unroll': 4, 'vector': True, 'order': 'ikj'}
    """
    from tunefleet.text.render import read_best

    _check_id(run_id)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise UsageError(f"top={top!r}: give a positive whole number")
    with _open(db) as conn:
        found = read_best(conn, run_id, top)
    return Records(best_trial(b) for b in found.best)


def _check_id(run_id: Any) -> None:
    if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < 1:
        raise UsageError(f"run id {run_id!r}: give a positive whole number (see tunefleet.runs())")
