"""One definition of every flag that more than one command takes.

``tunefleet tune`` is the front door of a one-node user: it accepts what that user needs of
``tunefleet coordinator`` (budget, search technique, patience, seeds, warm start) and of
``tunefleet worker`` (per-trial timeout, prefetch, code-generation processes, cores), and each
of those flags is defined once here, so a flag has the same name, help and limits wherever it
appears. Problem arguments (``--size``/``--dtype``/``--arg``) have their own single parser in
:mod:`tunefleet.options.args`.

Values are checked while the command line is parsed: a value out of range raises
:class:`~tunefleet.errors.UsageError` (one line, exit 2, naming the flag, the limit and what
to write instead) before anything is stored. The limits are what the storage and the
processes can honour: counts go into PostgreSQL ``integer`` columns, seconds must be finite.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import UsageError
from tunefleet.settings import DEFAULT_TECHNIQUE, MAX_BUDGET_S, MAX_COUNT

#: Largest run id (PostgreSQL ``bigint``).
MAX_ID = 2**63 - 1
#: Longest evaluation timeout, lease or polling interval: a day.
MAX_TIMEOUT_S = 24 * 3600.0
#: Most trials one worker claims ahead / code-generation processes it runs / cores it uses.
MAX_PREFETCH = 1000
MAX_PREPARE_WORKERS = 256
MAX_CORES = 4096.0


def _num(x: float) -> str:
    """A limit as people write it: whole numbers in full, others short."""
    return f"{int(x)}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def count(flag: str, low: int = 1, high: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number in ``low..high`` for ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise UsageError(
                f"{flag} {text!r} is not a whole number; write e.g. {flag} 20"
            ) from None
        if value < low:
            what = "zero or a positive number" if low == 0 else f"at least {low}"
            raise UsageError(f"{flag} {value}: use {what}")
        if value > high:
            raise UsageError(f"{flag} {value} is above the limit {high}; use a smaller number")
        return value

    return parse


def seconds(flag: str, high: float = MAX_BUDGET_S, low: float = 0.0) -> Callable[[str], float]:
    """A finite number above ``low`` (exclusive when 0) and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise UsageError(f"{flag} {text!r} is not a number; write e.g. {flag} 60") from None
        if not math.isfinite(value):
            raise UsageError(f"{flag} {text.strip()}: use a finite number, at most {_num(high)}")
        if not (value > low if low == 0 else value >= low):
            raise UsageError(f"{flag} {value:g}: use a positive number" + (
                f" of at least {low:g}" if low else ""))  # fmt: skip
        if value > high:
            raise UsageError(
                f"{flag} {value:g} is above the limit {_num(high)}; use a smaller number"
            )
        return value

    return parse


def budget_value(field: str) -> Callable[[str], Any]:
    """The flag of budget ``field`` (``max_trials``, ``max_seconds``, ...): read as a number
    here; its range is checked where the budget is defined, the one check every front door
    uses (:func:`tunefleet.options.budget.checked`)."""

    def parse(text: str) -> Any:
        from tunefleet.options.budget import FLAGS, LIMITS, checked

        value: Any = text
        try:
            value = int(text.strip()) if LIMITS[field][1] else float(text.strip())
        except ValueError:
            pass  # not a number: checked() says so, naming the flag
        return checked(field, value, FLAGS, text)

    return parse


@dataclass(frozen=True)
class Flag:
    """One flag: its name(s), argparse keywords and help, added the same way everywhere."""

    names: tuple[str, ...]
    help: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def add(self, parser: argparse.ArgumentParser, **override: Any) -> None:
        options = {"default": None, **dict(self.kwargs), "help": self.help, **override}
        parser.add_argument(*self.names, **options)


def _flag(*names: str, help: str, **kwargs: Any) -> Flag:
    return Flag(tuple(names), help, tuple(kwargs.items()))


# --- the run: budget and search (coordinator, tune) ---------------------------------------------
MAX_TRIALS = _flag(
    "--max-trials",
    type=budget_value("max_trials"),
    metavar="N",
    help="stop after N finished search trials, whatever their verdict (cache answers "
    "included; re-measurements of the best are extra)",
)
MAX_TIME = _flag(
    "--max-time",
    type=budget_value("max_seconds"),
    metavar="S",
    help="stop S seconds after this command started, the confirmation included (a resumed "
    "run gets S seconds more)",
)
TARGET = _flag(
    "--target",
    type=budget_value("target_gflops"),
    metavar="GFLOPS",
    help="stop once a trial reaches this GFLOP/s",
)
PATIENCE = _flag(
    "--patience",
    type=budget_value("patience"),
    metavar="K",
    help="stop after K finished trials without improving the best time",
)
NAME = _flag("--name", help="a label for the run (shown by `tunefleet runs`)")
RESUME = _flag(
    "--resume", type=count("--resume", high=MAX_ID), metavar="RUN", help="continue run RUN"
)
TECHNIQUE = _flag(
    "--technique",
    action="append",
    metavar="NAME",
    help=f"search technique (default {DEFAULT_TECHNIQUE}, TUNEFLEET_TECHNIQUE; any OpenTuner "
    "technique name, compare them with `tunefleet replay`); repeatable",
)
SEARCH_SEED = _flag(
    "--search-seed",
    type=count("--search-seed", low=0),
    metavar="N",
    help="seed of the search's own random draws, stored with the run (TUNEFLEET_SEARCH_SEED): "
    "the same outcomes in the same order give the same proposals; default: unseeded",
)
SEED_CONFIG = _flag(
    "--seed-config",
    action="append",
    metavar="JSON|FILE",
    help="measure this configuration first (a JSON object or list, or a .json file); repeatable",
)
WARM_START_FROM = _flag(
    "--warm-start-from",
    metavar="CLASS",
    help="seed with the best configurations of the same problem on another device class",
)
CONFIRM = _flag(
    "--confirm",
    type=count("--confirm", low=0, high=1000),
    metavar="K",
    help="when the budget ends, re-measure the K best configurations (fresh inputs, another "
    "worker where one is live) before reporting the best (default 3, TUNEFLEET_CONFIRM; 0: off)",
)
SEARCH_FLAGS = (MAX_TRIALS, MAX_TIME, TARGET, PATIENCE, NAME, RESUME, CONFIRM)
SEED_FLAGS = (TECHNIQUE, SEARCH_SEED, SEED_CONFIG, WARM_START_FROM)

# --- the worker's evaluation and sizing (worker, tune) ------------------------------------------
TIMEOUT = _flag(
    "--timeout",
    type=seconds("--timeout", high=MAX_TIMEOUT_S),
    metavar="SECONDS",
    help="seconds one whole evaluation may take: code generation, build, validation and "
    "timing together, under one limit (default 120; a trial past it is killed and recorded "
    "timed_out); a shorter limit the run sets for a trial from its best time bounds the "
    "timing step",
)
PREFETCH = _flag(
    "--prefetch",
    type=count("--prefetch", low=0, high=MAX_PREFETCH),
    metavar="N",
    help="trials claimed ahead of the one being timed, prepared meanwhile (default: one per "
    "code-generation process, sized by the worker)",
)
PREPARE_WORKERS = _flag(
    "--prepare-workers",
    type=count("--prepare-workers", low=0, high=MAX_PREPARE_WORKERS),
    metavar="N",
    help="code-generation processes, fixed; 0 prepares in the device process (default: the "
    "worker sizes its pool from its cores and the measured code-generation and device times)",
)
CORES = _flag(
    "--cores",
    type=seconds("--cores", high=MAX_CORES),
    metavar="N",
    help="cores this worker may use for code generation (default: what its CPU affinity, "
    "cgroup quota and SLURM_CPUS_PER_TASK allow, shared with the other workers of this host)",
)
PREBUILD = _flag(
    "--prebuild",
    action=argparse.BooleanOptionalAction,
    help="code-generation processes also compile on the device, so the device process only "
    "times (default on; --no-prebuild saves their device contexts)",
)
PAUSE_CODEGEN = _flag(
    "--pause-codegen",
    action=argparse.BooleanOptionalAction,
    help="on a CPU OpenCL device, stop the code-generation processes while a kernel is timed, "
    "so they do not share its cores (default on; off overlaps them, and the timings "
    "measure the competition)",
)
WORKER_FLAGS = (TIMEOUT, PREFETCH, PREPARE_WORKERS, CORES, PREBUILD, PAUSE_CODEGEN)


def add(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    for flag in flags:
        flag.add(parser)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The worker flags given to ``tune``, as ``tunefleet worker`` arguments."""
    out: list[str] = []
    for flag in WORKER_FLAGS:
        name = flag.names[0]
        value = getattr(args, name.lstrip("-").replace("-", "_"), None)
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(name if value else "--no-" + name.lstrip("-"))
        else:
            out += [name, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def run_id_arg(text: str) -> int:
    """A run or trial id of the command line: a positive ``bigint``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; ids are integers") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a valid id (ids start at 1)")
    if value > MAX_ID:
        raise argparse.ArgumentTypeError(f"{value} is not a valid id (ids end at {MAX_ID})")
    return value
