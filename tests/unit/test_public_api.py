"""``tunefleet.__all__`` is the public surface: every name resolves, lazily, and importing
the package loads neither the coordinator nor the API's modules until a name is used."""

from __future__ import annotations

import json
import subprocess
import sys

import tunefleet


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in tunefleet.__all__:
        assert getattr(tunefleet, name) is not None, name
    assert set(tunefleet.__all__) <= set(dir(tunefleet))
    assert tunefleet.feinsum.autotune is not None


def test_public_functions_and_classes_have_docstrings() -> None:
    for name in tunefleet.__all__:
        value = getattr(tunefleet, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), name


def test_importing_tunefleet_loads_no_api_or_coordinator() -> None:
    code = (
        "import json, sys, tunefleet; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tunefleet.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert not [m for m in loaded if m.startswith(("tunefleet.api", "tunefleet.coordinator"))]


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tunefleet.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")
