"""One vocabulary: every state, stage and reply kind is spelled in its enum's module only.

What counts as *spelling* a value, in the shipped Python (``src/tunefleet/``, ``coordinator/``,
``worker/``; ``migrations/versions`` is history and is not rewritten): a string constant equal
to a member's value, used as a value — compared (``== "done"``, ``in ("done", ...)``),
assigned, passed, returned, defaulted or listed. What does not count: a string that names
something else with the same word — a key (``row["done"]``, ``{"error": ...}``,
``.get("failed")``, ``"error" in row``), a column (``Column("error", ...)``), prose (docstrings,
f-string text) — and the few lines of :data:`NOT_A_STATE`, each with its reason.

The database's vocabulary (:mod:`tunefleet.vocabulary`: states, attempt outcomes, trial
purposes and sources, measurement sources) is checked in all shipped code; the
worker's trial stages, reply kinds and outcomes (:mod:`tunefleet.worker.vocabulary`) in the
worker, the only place they mean anything ("error" elsewhere is a column).

SQL keeps its literals (a partial index on ``state = 'pending'`` needs the literal): every
``state = '...'`` / ``state IN (...)`` literal in a SQL string must be a member of an enum, and
every ``purpose`` / ``source`` literal a member of a purpose or source enum.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tunefleet.vocabulary import (
    FINISHED_TRIAL_STATES,
    AttemptOutcome,
    MeasurementSource,
    RunState,
    TrialPurpose,
    TrialSource,
    TrialState,
    WorkerState,
)
from tunefleet.worker.vocabulary import ReplyKind, Stage, Verdict

ROOT = Path(__file__).resolve().parents[2]

DATABASE_ENUMS = (
    TrialState,
    RunState,
    WorkerState,
    AttemptOutcome,
    TrialPurpose,
    TrialSource,
    MeasurementSource,
)
DATABASE_VALUES = {str(v) for enum in DATABASE_ENUMS for v in enum}
WORKER_VALUES = DATABASE_VALUES | {str(v) for enum in (Stage, ReplyKind, Verdict) for v in enum}
VOCABULARY_MODULES = {"src/tunefleet/vocabulary.py", "worker/vocabulary.py"}

#: (file, the stripped source line): the same word naming something that is not a state.
NOT_A_STATE = {
    # tune()'s argument name in its one-line errors ("confirm must be ..."), not a purpose.
    ("src/tunefleet/api/tune.py", 'confirm = _count("confirm", confirm, 0, 1000)'),
    # The synthetic problem's fault names: "invalid" is the fault that makes a configuration
    # invalid (its outcome is TrialState.INVALID), a flag value users pass.
    ("src/tunefleet/problems/synthetic.py", 'FAULTS = ("none", "invalid", "fail", "hang")'),
    ("src/tunefleet/problems/synthetic.py", '("invalid", args["invalid_rate"]),'),
    ("src/tunefleet/problems/synthetic.py", 'if fault == "invalid":'),
    # A worker's liveness as status shows it (active but silent), not an attempt's outcome.
    (
        "src/tunefleet/text/render.py",
        'row["liveness"] = "lost"  # active but silent: killed without a goodbye',
    ),
    # The text of a connection error that has none, not an attempt's outcome.
    ("src/tunefleet/dashboard/server.py", 'first = first_line(exc, "lost")'),
}

_KEY_CALLS = {"get", "pop", "setdefault"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _not_values(tree: ast.AST) -> set[int]:
    """ids of string constants that are keys, columns, prose: not values of a vocabulary."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
        elif isinstance(node, ast.Dict):
            skip.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _KEY_CALLS:
                skip.add(id(node.args[0]))
            elif name == "Column":  # a table's (name, type) or a listing's (title, key)
                skip.update(id(a) for a in node.args[:2])
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and not isinstance(node.comparators[0], ast.Tuple | ast.List | ast.Set)
        ):
            skip.add(id(node.left))  # "error" in row: a key test
    return skip


def spellings(source: str, values: set[str], path: str = "<source>") -> list[str]:
    """``path:line: "value"`` for each string constant of ``source`` that spells a value."""
    tree = ast.parse(source)
    lines = source.splitlines()
    skip = _not_values(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if node.value not in values or id(node) in skip:
            continue
        if (path, lines[node.lineno - 1].strip()) in NOT_A_STATE:
            continue
        out.append(f"{path}:{node.lineno}: {node.value!r}")
    return sorted(out)


def _sources(*folders: str) -> Iterator[tuple[str, str]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in VOCABULARY_MODULES or rel.startswith("migrations/versions/"):
                continue
            yield rel, path.read_text()


def test_the_scan_sees_the_shipped_modules() -> None:
    """An empty walk would make the checks below vacuous."""
    names = {rel for rel, _ in _sources("src/tunefleet", "coordinator", "worker")}
    assert {"src/tunefleet/queries/queue.py", "coordinator/engine.py", "worker/loop.py"} <= names
    assert not names & VOCABULARY_MODULES


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('if trial.state == "done":\n    pass\n', 1),
        ('if state in ("pending", "running"):\n    pass\n', 2),
        ('finish(state="invalid")\n', 1),
        ('held.stage, held.state = "finished", "failed"\n', 2),
        ('def f(state: str = "finished") -> None:\n    return None\n', 1),
        ('COLOURS = {"done": "#2b8a3e"}\n', 0),
        ('n = row["done"] + row.get("failed", 0)\n', 0),
        ('if "error" in row:\n    pass\n', 0),
        ('Column("error", Text)\n', 0),
        ('msg = f"{n} done"\n', 0),
    ],
)
def test_the_scan_flags_values_and_only_values(source: str, flagged: int) -> None:
    assert len(spellings(source, WORKER_VALUES)) == flagged


def test_no_database_state_is_spelled_outside_its_enum() -> None:
    found = [
        hit
        for rel, text in _sources("src/tunefleet", "coordinator", "worker")
        for hit in spellings(text, DATABASE_VALUES, rel)
    ]
    assert found == []


def test_no_worker_stage_or_reply_kind_is_spelled_outside_its_enum() -> None:
    found = [hit for rel, text in _sources("worker") for hit in spellings(text, WORKER_VALUES, rel)]
    assert found == []


def test_an_attempt_ends_in_every_finished_state_of_its_trial() -> None:
    """A worker's completion writes the trial's state into the attempt's outcome."""
    assert {str(s) for s in FINISHED_TRIAL_STATES} <= {str(o) for o in AttemptOutcome}


def test_every_allowance_is_still_needed() -> None:
    """An exception whose line is gone or changed is removed, not left to excuse another."""
    texts = dict(_sources("src/tunefleet", "coordinator", "worker"))
    for path, line in NOT_A_STATE:
        assert line in {ln.strip() for ln in texts[path].splitlines()}, (path, line)


# --- SQL --------------------------------------------------------------------------------
_SQL_EQ = r"\s*(?:=|<>|!=|IS\s+(?:NOT\s+)?DISTINCT\s+FROM)\s*'([a-z_]+)'"
_SQL_IN = r"\s+(?:NOT\s+)?IN\s*\(\s*('[a-z_]+'(?:\s*,\s*'[a-z_]+')*)\s*\)"


def sql_literals(text: str, columns: str) -> set[str]:
    """The literals compared (``=``, ``<>``, ``IN (...)``, ...) with a column whose name ends
    in one of ``columns`` (``a|b``)."""
    column = rf"\b\w*(?:{columns})"
    found = set(re.findall(column + _SQL_EQ, text))
    for group in re.findall(column + _SQL_IN, text):
        found.update(re.findall(r"'([a-z_]+)'", group))
    return found


def sql_state_literals(text: str) -> set[str]:
    return sql_literals(text, "state|outcome")


def _strings(text: str) -> Iterable[str]:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _sql_found(columns: str) -> dict[str, set[str]]:
    """Each literal compared with such a column in the shipped SQL, and the files using it."""
    found: dict[str, set[str]] = {}
    for rel, text in _sources("src/tunefleet", "coordinator", "worker", "migrations"):
        for literal in (lit for s in _strings(text) for lit in sql_literals(s, columns)):
            found.setdefault(literal, set()).add(rel)
    return found


def test_sql_literals_of_states_are_members() -> None:
    assert sql_state_literals("WHERE t.state = 'pending' AND r.state IN ('running', 'x')") == {
        "pending",
        "running",
        "x",
    }
    assert sql_state_literals("a.outcome IS DISTINCT FROM 'released' OR outcome = 'y'") == {
        "released",
        "y",
    }
    found = _sql_found("state|outcome")
    assert {"pending", "running", "done", "active", "released"} <= set(found)  # it sees SQL
    strays = {lit: sorted(files) for lit, files in found.items() if lit not in DATABASE_VALUES}
    assert strays == {}


def test_sql_literals_of_purposes_and_sources_are_members_of_their_enums() -> None:
    """``purpose`` compares with trial purposes; ``source`` with trial or measurement
    sources (``t.source`` or ``m.source``: the alias alone does not say which table)."""
    assert sql_literals("t.purpose = 'confirm' AND m.source IN ('measured', 'x')", "source") == {
        "measured",
        "x",
    }
    purposes = _sql_found("purpose")
    sources = _sql_found("source")
    assert {"search", "confirm"} <= set(purposes)  # it sees SQL
    assert {"cache", "measured", "imported", "unverified"} <= set(sources)
    trial_or_measurement = {str(v) for enum in (TrialSource, MeasurementSource) for v in enum}
    strays = {
        **{lit: sorted(f) for lit, f in purposes.items() if lit not in set(TrialPurpose)},
        **{lit: sorted(f) for lit, f in sources.items() if lit not in trial_or_measurement},
    }
    assert strays == {}
