"""Settings: flag, then ``TUNEFLEET_*`` variable, then default; each bad value is a one-line
usage error naming the variable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tunefleet.errors import UsageError
from tunefleet.settings import (
    DatabaseSettings,
    home_dir,
    non_negative_float,
    non_negative_int,
    parse_bool,
    positive_float,
    positive_int,
    resolve,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "TUNEFLEET_DATABASE_URL",
        "TUNEFLEET_STATEMENT_TIMEOUT_MS",
        "TUNEFLEET_IDLE_TX_TIMEOUT_MS",
        "TUNEFLEET_CONNECT_TIMEOUT_S",
        "TUNEFLEET_HOME",
        "TUNEFLEET_TEST_KNOB",
    ):
        monkeypatch.delenv(name, raising=False)


def test_flag_beats_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve(None, "TEST_KNOB", 7, positive_int) == 7
    monkeypatch.setenv("TUNEFLEET_TEST_KNOB", "12")
    assert resolve(None, "TEST_KNOB", 7, positive_int) == 12
    assert resolve(3, "TEST_KNOB", 7, positive_int) == 3


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("TUNEFLEET_TEST_KNOB", raw)
    assert resolve(None, "TEST_KNOB", 7, positive_int) == 7


def test_surrounding_spaces_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEFLEET_TEST_KNOB", " 5 ")
    assert resolve(None, "TEST_KNOB", 7, positive_int) == 5


def test_bad_value_names_variable_value_and_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEFLEET_TEST_KNOB", "lots")
    with pytest.raises(UsageError) as info:
        resolve(None, "TEST_KNOB", 7, positive_int)
    message = str(info.value)
    assert message == (
        "TUNEFLEET_TEST_KNOB='lots' is not valid: must be a positive integer; fix or unset it"
    )
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("parse", "raw", "reason"),
    [
        (positive_int, "abc", "a positive integer"),
        (positive_int, "0", "a positive integer"),
        (positive_int, "-4", "a positive integer"),
        (positive_int, "1.5", "a positive integer"),
        (positive_float, "fast", "a positive number"),
        (positive_float, "0", "a positive number"),
        (positive_float, "-0.5", "a positive number"),
        (positive_float, "nan", "a positive number"),
        (positive_float, "inf", "a positive number"),
        (non_negative_int, "-1", "zero or a positive integer"),
        (non_negative_int, "none", "zero or a positive integer"),
        (non_negative_float, "-0.1", "zero or a positive number"),
        (non_negative_float, "inf", "zero or a positive number"),
        (non_negative_float, "later", "zero or a positive number"),
        (parse_bool, "maybe", "one of 1/0, true/false"),
        (parse_bool, "2", "one of 1/0, true/false"),
    ],
)
def test_each_parser_rejects_bad_values(parse, raw: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse(raw)


@pytest.mark.parametrize(
    ("parse", "raw", "value"),
    [
        (positive_int, "3", 3),
        (positive_float, "0.25", 0.25),
        (positive_float, "1e3", 1000.0),
        (non_negative_int, "0", 0),
        (non_negative_float, "0", 0.0),
        (non_negative_float, "90", 90.0),
        (parse_bool, "Yes", True),
        (parse_bool, "off", False),
        (parse_bool, "1", True),
    ],
)
def test_each_parser_accepts_good_values(parse, raw: str, value: object) -> None:
    assert parse(raw) == value


def test_database_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DatabaseSettings.build() == DatabaseSettings(url=None)
    monkeypatch.setenv("TUNEFLEET_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("TUNEFLEET_STATEMENT_TIMEOUT_MS", "1500")
    monkeypatch.setenv("TUNEFLEET_IDLE_TX_TIMEOUT_MS", "2500")
    monkeypatch.setenv("TUNEFLEET_CONNECT_TIMEOUT_S", "4")
    monkeypatch.setenv("TUNEFLEET_WAIT_FOR_DB_S", "300")
    built = DatabaseSettings.build()
    assert built.url == "postgresql://u@h/db"
    assert (built.statement_timeout_ms, built.idle_in_transaction_timeout_ms) == (1500, 2500)
    assert built.connect_timeout_s == 4
    assert built.wait_s == 300.0
    flagged = DatabaseSettings.build("postgresql://v@w/db2", statement_timeout_ms=99, wait_s=0)
    assert flagged.url == "postgresql://v@w/db2"
    assert flagged.statement_timeout_ms == 99
    assert flagged.idle_in_transaction_timeout_ms == 2500
    assert flagged.wait_s == 0


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("TUNEFLEET_STATEMENT_TIMEOUT_MS", "soon"),
        ("TUNEFLEET_STATEMENT_TIMEOUT_MS", "0"),
        ("TUNEFLEET_IDLE_TX_TIMEOUT_MS", "-5"),
        ("TUNEFLEET_CONNECT_TIMEOUT_S", "1.5"),
        ("TUNEFLEET_WAIT_FOR_DB_S", "-30"),
    ],
)
def test_database_settings_bad_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, raw: str
) -> None:
    monkeypatch.setenv(variable, raw)
    with pytest.raises(UsageError, match=f"^{variable}="):
        DatabaseSettings.build()


def test_settings_are_frozen() -> None:
    settings = DatabaseSettings.build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.url = "postgresql://u@h/db"  # type: ignore[misc]


def test_home_from_tunefleet_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "tf"))
    assert home_dir() == tmp_path / "tf"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TUNEFLEET_HOME", "~/elsewhere")
    assert home_dir() == tmp_path / "elsewhere"


def test_home_defaults_to_the_user_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home_dir() == tmp_path / "xdg" / "tunefleet"


def test_cli_bad_variable_is_one_line_exit_2(cli) -> None:
    line = cli.fails(
        "db",
        "upgrade",
        "--db",
        "postgresql://u@h/db",
        env={"TUNEFLEET_STATEMENT_TIMEOUT_MS": "abc"},
        code=2,
    )
    assert "TUNEFLEET_STATEMENT_TIMEOUT_MS='abc'" in line and "fix or unset it" in line


def test_cli_data_directory_follows_home_settings(cli, tmp_path: Path) -> None:
    """`db status` starts nothing; it says where the data lives."""
    proc = cli.run("db", "status", "--json", env={"TUNEFLEET_HOME": str(tmp_path / "h")})
    assert json.loads(proc.stdout)["data_dir"] == str(tmp_path / "h" / "postgres" / "data")
    env = {k: v for k, v in cli.env.items() if k != "TUNEFLEET_HOME"}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    cli.env = env
    proc = cli.run("db", "status", "--json")
    expected = tmp_path / "xdg" / "tunefleet" / "postgres" / "data"
    assert json.loads(proc.stdout)["data_dir"] == str(expected)
    assert not expected.exists(), "status creates nothing"
