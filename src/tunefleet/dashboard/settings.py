"""Owns :class:`DashboardSettings`: where ``tunefleet dashboard`` listens and who may look.

Precedence: flag, then ``TUNEFLEET_DASHBOARD_HOST`` / ``_PORT`` / ``_TOKEN`` / ``_REFRESH_S``,
then the default (:func:`tunefleet.settings.resolve`). Safe by default: it listens on the
loopback address only; any other address needs an access token, which every request must then
carry (a page asked for once with ``?token=...`` keeps it in a cookie).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from tunefleet.errors import UsageError
from tunefleet.settings import bounded, positive_float, resolve

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8750
#: Shortest token accepted: a guessable one would make the check pointless.
MIN_TOKEN_LENGTH = 16
#: Slowest and fastest self-refresh of the page (seconds).
MAX_REFRESH_S = 3600.0
MIN_REFRESH_S = 0.2

_TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/=-]+")
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def port_number(raw: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a TCP port number (0 to 65535)") from None
    if not 0 <= value <= 65535:
        raise ValueError("must be a TCP port number (0 to 65535)")
    return value


@dataclass(frozen=True)
class DashboardSettings:
    """One dashboard's settings. Build with :meth:`build` (applies env vars and checks)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    #: Required of every request when set (always set when ``host`` is not loopback).
    token: str | None = None
    #: How often an open page asks for news (seconds).
    refresh_s: float = 2.0
    #: Database connections kept for requests (one request uses one at a time).
    connections: int = 4

    @classmethod
    def build(
        cls,
        *,
        host: str | None = None,
        port: int | None = None,
        token: str | None = None,
        refresh_s: float | None = None,
    ) -> DashboardSettings:
        chosen_host = resolve(host, "DASHBOARD_HOST", DEFAULT_HOST, str).strip()
        if not chosen_host:
            raise UsageError(f"--host is empty; give an address to listen on, e.g. {DEFAULT_HOST}")
        chosen_token = resolve(token, "DASHBOARD_TOKEN", None, str)
        if chosen_token is not None:
            chosen_token = chosen_token.strip()
            if not _TOKEN_RE.fullmatch(chosen_token):
                raise UsageError(
                    "the dashboard token may use letters, digits and - _ . ~ + / = only (it "
                    "travels in a cookie); e.g. python -c 'import secrets; "
                    "print(secrets.token_urlsafe())'"
                )
            if len(chosen_token) < MIN_TOKEN_LENGTH:
                raise UsageError(
                    f"the dashboard token is {len(chosen_token)} characters long; use at least "
                    f"{MIN_TOKEN_LENGTH}, e.g. python -c 'import secrets; "
                    "print(secrets.token_urlsafe())'"
                )
        if not is_loopback(chosen_host) and chosen_token is None:
            raise UsageError(
                f"--host {chosen_host} is reachable from other machines: give an access token "
                "with TUNEFLEET_DASHBOARD_TOKEN (or --token), or keep the default "
                f"{DEFAULT_HOST} and open it through an ssh tunnel"
            )
        chosen_refresh = resolve(
            refresh_s, "DASHBOARD_REFRESH_S", 2.0, bounded(positive_float, MAX_REFRESH_S)
        )
        if not MIN_REFRESH_S <= chosen_refresh <= MAX_REFRESH_S:
            raise UsageError(
                f"--refresh {chosen_refresh:g}: use {MIN_REFRESH_S:g} to {MAX_REFRESH_S:g} seconds"
            )
        return cls(
            host=chosen_host,
            port=resolve(port, "DASHBOARD_PORT", DEFAULT_PORT, port_number),
            token=chosen_token,
            refresh_s=chosen_refresh,
        )
