"""``DashboardSettings``: flag, then ``TUNEFLEET_DASHBOARD_*``, then default; safe by default
(loopback only; any other address needs a token); every bad value is a one-line error."""

from __future__ import annotations

import dataclasses

import pytest

from tunefleet.cli import main
from tunefleet.dashboard.settings import DashboardSettings, is_loopback
from tunefleet.errors import UsageError

TOKEN = "0123456789abcdef-token"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOST", "PORT", "TOKEN", "REFRESH_S"):
        monkeypatch.delenv(f"TUNEFLEET_DASHBOARD_{name}", raising=False)


def test_defaults_are_loopback_port_8750_no_token_and_frozen() -> None:
    s = DashboardSettings.build()
    assert (s.host, s.port, s.token, s.refresh_s) == ("127.0.0.1", 8750, None, 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]


def test_flags_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEFLEET_DASHBOARD_PORT", "9000")
    monkeypatch.setenv("TUNEFLEET_DASHBOARD_REFRESH_S", "5")
    monkeypatch.setenv("TUNEFLEET_DASHBOARD_TOKEN", TOKEN)
    s = DashboardSettings.build()
    assert (s.port, s.refresh_s, s.token) == (9000, 5.0, TOKEN)
    s = DashboardSettings.build(port=9100, refresh_s=1.0, token="x" * 16)
    assert (s.port, s.refresh_s, s.token) == (9100, 1.0, "x" * 16)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2", "[::1]"])
def test_loopback_addresses_need_no_token(host: str) -> None:
    assert is_loopback(host)
    assert DashboardSettings.build(host=host).token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "head-node.example.org"])
def test_any_other_address_needs_a_token(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not is_loopback(host)
    with pytest.raises(UsageError, match="TUNEFLEET_DASHBOARD_TOKEN") as info:
        DashboardSettings.build(host=host)
    assert f"--host {host} is reachable from other machines" in str(info.value)
    assert DashboardSettings.build(host=host, token=TOKEN).token == TOKEN
    monkeypatch.setenv("TUNEFLEET_DASHBOARD_TOKEN", TOKEN)
    assert DashboardSettings.build(host=host).token == TOKEN


def test_a_short_token_is_refused() -> None:
    with pytest.raises(UsageError, match="at least 16"):
        DashboardSettings.build(token="short")


@pytest.mark.parametrize("token", ["with spaces in it, long enough", "semi;colon-0123456789"])
def test_a_token_that_cannot_travel_in_a_cookie_is_refused(token: str) -> None:
    with pytest.raises(UsageError, match="letters, digits"):
        DashboardSettings.build(token=token)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORT", "eighty", "TUNEFLEET_DASHBOARD_PORT='eighty' is not valid"),
        ("PORT", "70000", "TUNEFLEET_DASHBOARD_PORT='70000' is not valid"),
        ("REFRESH_S", "-1", "TUNEFLEET_DASHBOARD_REFRESH_S='-1' is not valid"),
        ("REFRESH_S", "0.01", "use 0.2 to 3600 seconds"),
    ],
)
def test_a_bad_variable_is_named(
    name: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"TUNEFLEET_DASHBOARD_{name}", value)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        DashboardSettings.build()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines"),
        (["--token", "short"], "the dashboard token is 5 characters long"),
        (["--port", "65536"], "--port 65536 is above the limit 65535"),
        (["--port", "http"], "--port 'http' is not a whole number"),
        (["--refresh", "0"], "--refresh 0: use a positive number"),
    ],
)
def test_the_command_says_what_is_wrong_in_one_line_and_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The settings are checked before any database is opened: no --db is needed to fail.
    assert main(["dashboard", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tunefleet: error: ") and message in err[0], err
