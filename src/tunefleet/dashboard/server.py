"""The dashboard's HTTP server: three pages, a small JSON API, and the assets, read-only.

The standard library's :class:`~http.server.ThreadingHTTPServer` (a thread per request) is
enough for a handful of people whose pages ask for news every few seconds, and it needs
nothing installed on a cluster without network access. Database connections come from a
small pool (:class:`Pool`); each is made read-only when it opens
(:func:`tunefleet.queries.dashboard.make_read_only`).

Routes (``RUN`` and ``TRIAL`` are decimal ids; anything else is a 404):

``GET /``, ``/runs/RUN``, ``/fleet``        the pages (one shell, drawn by ``app.js``)
``GET /static/NAME``                        the script, style sheet and icon
``GET /api/runs``                           every run with its progress
``GET /api/runs/RUN``                       one run's progress (the page polls it)
``GET /api/runs/RUN/best``                  its best configuration and reproduce command
``GET /api/runs/RUN/charts``                best so far, speed histogram, failure reasons
``GET /api/runs/RUN/timeline``              how busy each worker was over the run
``GET /api/runs/RUN/trials?sort=&order=&limit=&offset=``  the configuration table
``GET /api/runs/RUN/importance?scope=run|key&method=variance|forest&top=N``  parameter
                                            importance, speed per value, top N vs the rest
``GET /api/runs/RUN/trials/TRIAL``          one trial, its code and reproduce command
``GET /api/fleet``                          workers, devices, heartbeats, served runs

Nothing else is answered: other methods get 405, a run or trial that does not exist 404
(JSON under ``/api``, a short page elsewhere), a database that cannot be reached 503, any
other failure 500 with a one-line reason; never a traceback. With a token every request must
carry it (``Authorization: Bearer``, the ``tunefleet_token`` cookie, or ``?token=`` once,
which sets the cookie and redirects to the same page without it); without one, requests
whose ``Host`` is not a loopback name are refused (a web page elsewhere cannot reach a
loopback dashboard through DNS rebinding).
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import psycopg

from tunefleet.busy import busy_shares
from tunefleet.dashboard.settings import DashboardSettings, is_loopback
from tunefleet.errors import DatabaseUnavailable, first_line
from tunefleet.queries import dashboard as q
from tunefleet.text.output import jsonable

_log = logging.getLogger("tunefleet.dashboard")

Conn = psycopg.Connection[Any]
COOKIE = "tunefleet_token"
#: Most rows of the configuration table one request returns.
MAX_PAGE = 500
#: Bins of the speed histogram and of the worker timeline.
HISTOGRAM_BINS = 30
TIMELINE_BINS = 60
_ID = r"([1-9][0-9]{0,17})"  # fits PostgreSQL's bigint
_RUN_API = re.compile(
    r"/api/runs/" + _ID + r"(/best|/charts|/timeline|/importance|/trials(?:/" + _ID + r")?)?"
)
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}


class NotFound(Exception):
    """A run, trial or path that does not exist: 404 with this message."""


class BadRequest(Exception):
    """A query parameter out of range: 400 with this message."""


# --- database connections --------------------------------------------------------------


class Pool:
    """At most ``size`` open connections, handed to one request at a time.

    A connection that failed (server restarted, network gone) is closed, never handed out
    again; the next request opens a fresh one."""

    def __init__(self, connect: Callable[[], Conn], size: int) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[Conn] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        if not self._slots.acquire(timeout=30):
            raise DatabaseUnavailable("every database connection of the dashboard is busy")
        conn: Conn | None = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                fresh = self._connect()
                try:
                    q.make_read_only(fresh)
                except BaseException:
                    fresh.close()  # never hand out a session that could write
                    raise
                conn = fresh
            yield conn
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            conn = None
            raise
        finally:
            if conn is not None:
                if conn.closed or conn.broken or self._closed:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


# --- the application ---------------------------------------------------------------------


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, data: Any) -> Response:
    body = json.dumps(jsonable(data), separators=(",", ":"), allow_nan=False).encode()
    return Response(status, body, "application/json")


def _asset(name: str) -> bytes:
    return (resources.files("tunefleet.dashboard") / "static" / name).read_bytes()


def _int_param(params: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = params.get(name)
    if not values:
        return default
    raw = values[-1]
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not low <= int(raw) <= high:
        raise BadRequest(f"{name}={raw!r} must be a whole number from {low} to {high}")
    return int(raw)


class Dashboard:
    """Routes one request to a page, an asset or an API answer (no HTTP details here)."""

    def __init__(self, settings: DashboardSettings, pool: Pool) -> None:
        self.settings = settings
        self.pool = pool
        self._shell = _asset("index.html").decode()
        from tunefleet.dashboard.importance import ImportanceCache

        self.importance = ImportanceCache(BadRequest)

    def page(self) -> bytes:
        refresh = f"{self.settings.refresh_s:g}"
        return self._shell.replace("{{refresh_s}}", refresh).encode()

    def get(self, path: str, params: dict[str, list[str]]) -> Response:
        if path in ("/", "/fleet"):
            return Response(200, self.page(), "text/html; charset=utf-8")
        m = re.fullmatch(r"/runs/" + _ID, path)
        if m:
            with self.pool.connection() as conn:
                if q.run_settings(conn, int(m.group(1))) is None:
                    raise NotFound(f"run {m.group(1)} does not exist in this database")
            return Response(200, self.page(), "text/html; charset=utf-8")
        m = re.fullmatch(r"/static/([a-z]+\.[a-z]+)", path)
        if m and m.group(1) in _ASSETS:
            return Response(
                200,
                _asset(m.group(1)),
                _ASSETS[m.group(1)],
                {"Cache-Control": "no-cache"},
            )
        if path.startswith("/api/"):
            return _json(200, self.api(path, params))
        raise NotFound(f"no page {path}")

    def api(self, path: str, params: dict[str, list[str]]) -> Any:
        with self.pool.connection() as conn:
            if path == "/api/runs":
                return {"runs": q.list_runs(conn)}
            if path == "/api/fleet":
                return {"workers": q.fleet(conn), "alive_s": q.ALIVE_S}
            m = _RUN_API.fullmatch(path)
            if not m:
                raise NotFound(f"no API endpoint {path}")
            run_id = int(m.group(1))
            part = m.group(2) or ""
            if part == "":
                summary = q.run_summary(conn, run_id)
                if summary is None:
                    raise NotFound(f"run {run_id} does not exist in this database")
                return {"run": summary}
            # The other calls need only the run's settings (far cheaper than its progress).
            run = q.run_settings(conn, run_id)
            if run is None:
                raise NotFound(f"run {run_id} does not exist in this database")
            if part == "/best":
                best = q.best(conn, run_id)
                if best is not None:
                    best["reproduce"] = _reproduce(run, best)
                return {"best": best}
            if part == "/charts":
                c = q.speed_charts(conn, run_id, bins=HISTOGRAM_BINS)
                return {
                    "best_so_far": c["best_so_far"],
                    "histogram": c["histogram"],
                    "failures": q.failure_groups(conn, run_id),
                }
            if part == "/timeline":
                return {
                    "timeline": _timeline(
                        q.worker_timeline(conn, run_id, bins=TIMELINE_BINS),
                        busy_shares(q.worker_intervals(conn, run_id)),
                    ),
                    "timeline_bins": TIMELINE_BINS,
                }
            if part == "/importance":
                return self.importance.answer(conn, run_id, params)
            if m.group(3) is None:
                return self._trials(conn, run_id, params)
            trial_id = int(m.group(3))
            row = q.trial(conn, run_id, trial_id)
            if row is None:
                raise NotFound(f"run {run_id} has no trial {trial_id}")
            return {"trial": row, "reproduce": _reproduce(run, row)}

    def _trials(self, conn: Conn, run_id: int, params: dict[str, list[str]]) -> Any:
        sort = (params.get("sort") or ["gflops"])[-1]
        if sort not in q.SORT_COLUMNS:
            raise BadRequest(
                f"sort={sort!r} is not a column; use one of {', '.join(q.SORT_COLUMNS)}"
            )
        order = (params.get("order") or ["desc"])[-1]
        if order not in ("asc", "desc"):
            raise BadRequest(f"order={order!r} must be asc or desc")
        limit = _int_param(params, "limit", 50, 1, MAX_PAGE)
        offset = _int_param(params, "offset", 0, 0, 10**9)
        rows = q.configurations(
            conn, run_id, sort=sort, descending=order == "desc", limit=limit, offset=offset
        )
        total = int(rows[0].pop("total")) if rows else q.finished_count(conn, run_id)
        for r in rows[1:]:
            del r["total"]
        return {
            "trials": rows,
            "total": total,
            "sort": sort,
            "order": order,
            "limit": limit,
            "offset": offset,
        }


def _timeline(rows: list[dict[str, Any]], shares: dict[str, float]) -> list[dict[str, Any]]:
    """Rows of (worker, bin, busy) as one entry per worker with its list of busy bins and its
    ``busy_share`` (``shares``: :mod:`tunefleet.busy`, the figure ``status`` and the plot
    quote; the bins only draw when it was busy)."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        w = out.setdefault(
            r["worker_id"],
            {
                "worker_id": r["worker_id"],
                "host": r["worker_host"],
                "held_s": r["held_s"],
                "span_s": r["span_s"],
                "bins": {},
            },
        )
        w["bins"][int(r["bin"])] = r["busy"]
    result = []
    for w in out.values():
        bins = w.pop("bins")
        w["busy"] = [bins.get(i, 0.0) for i in range(TIMELINE_BINS)]
        w["busy_share"] = shares.get(str(w["worker_id"]), 0.0)
        result.append(w)
    return result


def _reproduce(run: dict[str, Any], trial: dict[str, Any]) -> str:
    from tunefleet.text.render import reproduce_command

    return reproduce_command(run, trial)


# --- HTTP ---------------------------------------------------------------------------------


def _error_page(status: int, message: str) -> bytes:
    from html import escape

    title = f"{status} {HTTPStatus(status).phrase}"
    return (
        f"<!doctype html><meta charset=utf-8><title>{escape(title)} - tunefleet</title>"
        f'<link rel=stylesheet href="/static/style.css"><main class=error>'
        f"<h1>{escape(title)}</h1><p>{escape(message)}</p>"
        f'<p><a href="/">all runs</a></p></main>'
    ).encode()


def _make_handler(app: Dashboard) -> type[BaseHTTPRequestHandler]:
    token = app.settings.token

    class Handler(BaseHTTPRequestHandler):
        server_version = "tunefleet-dashboard"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle's algorithm the body would wait
        # for the client's delayed ACK of the headers (40 ms per keep-alive request).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("%s %s", self.address_string(), format % args)

        def _send(self, r: Response, head_only: bool = False) -> None:
            self.send_response(r.status)
            self.send_header("Content-Type", r.content_type)
            self.send_header("Content-Length", str(len(r.body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header(
                "Content-Security-Policy",
                "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                "frame-ancestors 'none'",
            )
            if r.content_type.startswith("application/json"):
                self.send_header("Cache-Control", "no-store")
            for k, v in r.headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not head_only:
                self.wfile.write(r.body)

        def _fail(self, status: int, message: str, api: bool) -> Response:
            if api:
                return _json(status, {"error": message})
            return Response(status, _error_page(status, message), "text/html; charset=utf-8")

        def _authorised(self, params: dict[str, list[str]]) -> bool:
            if token is None:
                return True
            given: list[str] = []
            header = self.headers.get("Authorization", "")
            if header.startswith("Bearer "):
                given.append(header[len("Bearer ") :].strip())
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
            if COOKIE in cookie:
                given.append(cookie[COOKIE].value)
            given += params.get("token", [])
            return any(hmac.compare_digest(g.encode(), token.encode()) for g in given)

        def _host_ok(self) -> bool:
            if token is not None:
                return True
            host = self.headers.get("Host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            return is_loopback(name)

        def do_GET(self) -> None:
            self._answer(head_only=False)

        def do_HEAD(self) -> None:
            self._answer(head_only=True)

        def _answer(self, head_only: bool) -> None:
            parts = urlsplit(self.path)
            path = parts.path
            api = path.startswith("/api/")
            params = parse_qs(parts.query, keep_blank_values=True)
            if not self._host_ok():
                r = self._fail(403, "open the dashboard as localhost (an ssh tunnel)", api)
            elif not self._authorised(params):
                r = self._fail(401, "this dashboard needs its access token (?token=...)", api)
            elif token is not None and "token" in params:
                # Keep the token out of the address bar and history: a cookie carries it.
                rest = {k: v for k, v in params.items() if k != "token"}
                target = quote(path, safe="/%") + (
                    "?" + "&".join(f"{quote(k)}={quote(x)}" for k, vs in rest.items() for x in vs)
                    if rest
                    else ""
                )
                r = Response(
                    303,
                    b"",
                    "text/plain",
                    {
                        "Location": target,
                        "Set-Cookie": f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict",
                    },
                )
            else:
                r = self._route(path, params, api)
            try:
                self._send(r, head_only)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser went away; nothing to tell it

        def _route(self, path: str, params: dict[str, list[str]], api: bool) -> Response:
            try:
                return app.get(path, params)
            except NotFound as exc:
                return self._fail(404, str(exc), api)
            except BadRequest as exc:
                return self._fail(400, str(exc), api)
            except DatabaseUnavailable as exc:
                return self._fail(503, str(exc), api)
            except psycopg.OperationalError as exc:
                first = first_line(exc, "lost")
                return self._fail(503, f"the database connection failed: {first}", api)
            except Exception as exc:
                _log.exception("dashboard request %s failed", path)
                return self._fail(500, f"{type(exc).__name__}: {first_line(exc, '')}", api)

        def _not_allowed(self) -> None:
            # The request's body is never read: the connection cannot carry another request.
            self.close_connection = True
            api = urlsplit(self.path).path.startswith("/api/")
            r = self._fail(405, "the dashboard is read-only: only GET and HEAD", api)
            r.headers["Allow"] = "GET, HEAD"
            self._send(r)

        do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    return Handler


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class DashboardServer:
    """The HTTP server bound to its address (port 0: any free one), not yet serving."""

    def __init__(self, settings: DashboardSettings, connect: Callable[[], Conn]) -> None:
        self.settings = settings
        self.pool = Pool(connect, settings.connections)
        self.app = Dashboard(settings, self.pool)
        server_class = _IPv6Server if ":" in settings.host else ThreadingHTTPServer
        self.httpd = server_class((settings.host, settings.port), _make_handler(self.app))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.settings.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> DashboardServer:
        """Serve from a background thread (tests, embedding); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="dashboard", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=10)
        self.httpd.server_close()
        self.pool.close()
