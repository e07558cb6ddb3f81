"""The web console of `danube admin serve --mode ui`: a Starlette app of server-rendered
pages (Jinja2), a JSON endpoint for the charts, and form actions.

    browser ──HTTP──▶ app (this module) ── Backend: one admin connection per request,
                      │                    with the user's token ──▶ broker (RBAC decides)
                      └─ SessionStore: session id cookie ─▶ token, CSRF token

Rules every response keeps:
1. No page, chart or action without a session; a session starts at /login with a token
   the broker authenticates or, where the broker lets anonymous callers in (security
   off), at the first page a browser navigates to, without a login.
2. Every POST carries the session's CSRF token and, when the browser sends one, an
   Origin of this console; the session cookie is HttpOnly and SameSite=Strict.
3. No CORS: no Access-Control-* header is ever sent, so no other origin reads an
   answer. Scripts load from this origin only (Content-Security-Policy); pages are not
   framed and not cached.
4. Actions go through the same admin API as the CLI: the broker's refusal (with its
   code) is what the user sees, and nothing is done on the console's own authority.
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import logging
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from danube_zmq.client.admin import broker_label
from danube_zmq.config.broker_config import BOOLEAN_POLICIES, TOPIC_POLICY_NAMES, ZERO_IS_NEVER
from danube_zmq.doors.console.backend import Backend, ConsoleSettings, gather_or_error
from danube_zmq.doors.console.sessions import Session, SessionStore
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError, InvalidArgument
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = ["COOKIE", "Console", "build_app", "console_hosts"]

log = logging.getLogger(__name__)

COOKIE = "danube_console"
# The login form's own CSRF token (double submit: cookie and field), before any session.
LOGIN_COOKIE = "danube_console_login"
# A Danube token is a JWT of a few hundred bytes; anything far larger is not one.
TOKEN_BYTES_MAX = 16 * 1024
# Form bodies are a few fields; Starlette's parser is bounded by this per field too.
FORM_FIELD_BYTES_MAX = 64 * 1024

_HERE = Path(__file__).resolve().parent
_SECURITY_HEADERS = [
    # Plotly sets styles from script (inline style attributes and <style> elements);
    # scripts themselves come from this origin only.
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                 b"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                 b"base-uri 'none'; form-action 'self'; object-src 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # Not no-referrer: Chromium then sends `Origin: null` on the console's own form posts.
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class _SecurityHeaders:
    """Adds the headers above to every response, and `no-store` to all but static files."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")]
                headers.extend(_SECURITY_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


class _AllowedHosts:
    """Serves only requests whose Host header names this console (421 otherwise). A page
    at evil.example that rebinds its name to 127.0.0.1 sends `Host: evil.example` and a
    matching Origin: without this, the Origin check (which compares against the Host)
    passes and the page can log in to an open cluster and act."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = _host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1"))
            if host not in self.hosts:
                response = PlainTextResponse(
                    f"this console does not answer to the host name {host[:100]!r}: it answers to"
                    f" {', '.join(sorted(self.hosts))}; start it with --allowed-host NAME for another name",
                    status_code=421)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """The name of a Host header, without its port, lower case ('[::1]:80' -> '::1')."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def console_hosts(listen_host: str, allowed: tuple[str, ...] = ()) -> frozenset[str]:
    """The host names a console listening on `listen_host` answers to: that address,
    loopback's names, the names given (--allowed-host), and on a wildcard address this
    machine's names and addresses."""
    hosts = {"localhost", "127.0.0.1", "::1", *(_host_name(name) for name in allowed)}
    if listen_host in ("0.0.0.0", "::", ""):
        import socket

        import psutil

        hosts.update({socket.gethostname().lower(), socket.getfqdn().lower()})
        for addresses in psutil.net_if_addrs().values():
            hosts.update(a.address.partition("%")[0].lower() for a in addresses
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    else:
        hosts.add(_host_name(listen_host) if ":" not in listen_host else listen_host.lower())
    return frozenset(hosts)


def _local_path(target: str | None, default: str = "/cluster") -> str:
    """`target` when it is a path on this console (no scheme, no host, no `//`): the
    login form's `next` must not send anyone elsewhere."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    parsed = urllib.parse.urlsplit(target)
    if parsed.scheme or parsed.netloc:
        return default
    return target


def _status_of(error: str | None) -> int:
    if error is None:
        return 200
    code = error.partition(":")[0]
    return {"PERMISSION_DENIED": 403, "NOT_FOUND": 404, "INVALID_ARGUMENT": 400,
            "UNAUTHENTICATED": 401}.get(code, 502)


def _whole(name: str, text: str) -> int:
    """`text` as a whole number >= 0 of at most 19 ASCII digits (an int64): `isdigit`
    would pass `²` and a 5,000-digit number, which `int` then refuses with an error no
    page answers."""
    text = text.strip()
    if not re.fullmatch(r"[0-9]{1,19}", text):
        raise InvalidArgument(f"{name}: {text[:40]!r} is not a whole number >= 0")
    return int(text)


def _switch(name: str, text: str) -> int:
    """An on/off policy from a form: true/on/1 or false/off/0."""
    word = text.strip().lower()
    if word in ("true", "on", "1"):
        return 1
    if word in ("false", "off", "0"):
        return 0
    raise InvalidArgument(f"{name}: {text[:40]!r} is not on or off (true/false, on/off, 1/0)")


def _seek_time_ms(text: str) -> int:
    """A publish time as ms since the epoch, from digits (ms) or ISO 8601 with a zone."""
    text = text.strip()
    if re.fullmatch(r"[0-9]+", text):
        return _whole("publish time", text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"publish time {text!r}: give ms since the epoch or ISO 8601, e.g."
                              " 2026-11-25T12:00:00Z") from None
    if when.tzinfo is None:
        raise InvalidArgument(f"publish time {text!r} has no time zone: add Z or +HH:MM")
    return int(when.timestamp() * 1000)


def _policy_values(form: FormData) -> dict[str, int | None]:
    """The policy fields a form filled in (blank: unchanged), as non-negative ints."""
    values: dict[str, int | None] = {}
    for name in TOPIC_POLICY_NAMES:
        raw = str(form.get(name) or "").strip()
        if not raw:
            continue
        values[name] = _switch(name, raw) if name in BOOLEAN_POLICIES else _whole(name, raw)
    if not values:
        raise InvalidArgument("fill in at least one policy")
    return values


class Console:
    """The app's state: settings, sessions, the backend, templates."""

    def __init__(self, settings: ConsoleSettings, *, sessions: SessionStore | None = None,
                 clock: Callable[[], float] = time.time, secure_cookies: bool = False) -> None:
        self.settings = settings
        self.sessions = sessions or SessionStore()
        self.clock = clock
        self.secure_cookies = secure_cookies
        self.backend = Backend(settings)
        self.templates = Jinja2Templates(directory=str(_HERE / "templates"))
        self.templates.env.globals["policy_names"] = TOPIC_POLICY_NAMES
        self.templates.env.filters["quote"] = lambda value: urllib.parse.quote(str(value), safe="")
        self.templates.env.globals["broker_label"] = broker_label
        self.templates.env.filters["when"] = _when
        self.templates.env.filters["policy_value"] = _policy_value
        self.templates.env.filters["bytes"] = _bytes

    # -- sessions ------------------------------------------------------------------

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE), self.clock())

    def render(self, request: Request, template: str, session: Session | None, status: int = 200,
               **context: Any) -> Response:
        return self.templates.TemplateResponse(
            request, template, {"session": session, "flashes": session.take_flashes() if session else [],
                                "refresh_ms": self.settings.refresh_ms,
                                "prometheus": self.settings.prometheus_url is not None, **context},
            status_code=status)

    def page(self, title: str, template: str,
             load: Callable[[Request, Session], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        """A GET page: the login redirect without a session, else `load`'s data (or the
        broker's refusal) rendered with `template`."""

        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            opened = None
            if session is None:
                session = opened = await self._open_session(request)
                if session is None:
                    return self._to_login(request)
            data, error = await gather_or_error(load(request, session))
            if error is not None and error.startswith("UNAUTHENTICATED"):
                # The token expired or was revoked since login: log in again.
                self.sessions.drop(session.session_id)
                return self._to_login(request)
            response = self.render(request, template, session, status=_status_of(error), title=title, data=data,
                                   error=error, query=request.query_params)
            if opened is not None:
                self._set_cookie(response, COOKIE, opened.session_id, None)
            return response
        return endpoint

    async def _open_session(self, request: Request) -> Session | None:
        """A session without a token when the broker lets an anonymous caller in (security
        off), as the login would make from an empty token: nobody has one to type. Only
        for a page the browser navigates to (not another site's image or fetch, which
        would only churn sessions); actions still need the session's CSRF token."""
        if request.headers.get("sec-fetch-mode", "navigate") != "navigate":
            return None
        _, error = await gather_or_error(self.backend.check_login(None))
        return None if error is not None else self.sessions.create(None, self.clock())

    def action(self, run: Callable[[Session, FormData], Awaitable[tuple[str, str]]]
               ) -> Callable[[Request], Awaitable[Response]]:
        """A POST action: session, CSRF and origin checked; `run` returns the page to
        go back to and what it did. The broker's refusal is shown on that page."""

        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:
                return PlainTextResponse("log in first", status_code=401)
            if not self._same_origin(request):
                return PlainTextResponse("cross-origin request refused", status_code=403)
            form = await request.form(max_files=0, max_fields=64, max_part_size=FORM_FIELD_BYTES_MAX)
            if not session.csrf_ok(str(form.get("csrf") or "")):
                return PlainTextResponse("the form's CSRF token is missing or wrong: reload the page", status_code=403)
            back = _local_path(str(form.get("back") or ""), "/cluster")
            try:
                back, done = await run(session, form)
            except DanubeError as err:
                session.flash("error", f"{err.code.name}: {err}")
            except (TimeoutError, OSError) as err:
                session.flash("error", f"UNAVAILABLE: {err}")
            else:
                session.flash("ok", done)
            return RedirectResponse(back, status_code=303)
        return endpoint

    def _same_origin(self, request: Request) -> bool:
        """The browser's Origin (or, lacking it, Sec-Fetch-Site) says the form is ours;
        a client that sends neither (curl) must still bring the CSRF token."""
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            return origin == f"{request.url.scheme}://{request.url.netloc}"
        return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")

    def _to_login(self, request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={urllib.parse.quote(target, safe='')}", status_code=303)

    def _set_cookie(self, response: Response, name: str, value: str, max_age: int | None) -> None:
        response.set_cookie(name, value, max_age=max_age, httponly=True, samesite="strict", path="/",
                            secure=self.secure_cookies)

    # -- login -------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        login_csrf = request.cookies.get(LOGIN_COOKIE) or _fresh_token()
        response = self.render(request, "login.html", None, title="Log in", login_csrf=login_csrf,
                               next=_local_path(request.query_params.get("next")), error=None)
        self._set_cookie(response, LOGIN_COOKIE, login_csrf, 3600)
        return response

    async def login(self, request: Request) -> Response:
        if not self._same_origin(request):
            return PlainTextResponse("cross-origin request refused", status_code=403)
        form = await request.form(max_files=0, max_fields=8, max_part_size=FORM_FIELD_BYTES_MAX)
        expected = request.cookies.get(LOGIN_COOKIE)
        given = str(form.get("csrf") or "")
        if not expected or not Session(session_id="", token=None, csrf=expected, created_s=0,
                                       last_seen_s=0).csrf_ok(given):
            return PlainTextResponse("the login form's CSRF token is missing or wrong: reload the page",
                                     status_code=403)
        token = str(form.get("token") or "").strip() or None
        target = _local_path(str(form.get("next") or ""))
        error = None
        if token is not None and len(token) > TOKEN_BYTES_MAX:
            error = f"that token is over {TOKEN_BYTES_MAX} bytes: not a Danube token"
        else:
            _, error = await gather_or_error(self.backend.check_login(token))
            if error is not None and token is None:
                error = f"this cluster needs a token ({error})"
        if error is not None:
            return self.render(request, "login.html", None, status=401, title="Log in", login_csrf=expected,
                               next=target, error=error)
        self.sessions.drop(request.cookies.get(COOKIE))  # a new id at login: no fixation
        session = self.sessions.create(token, self.clock())
        response = RedirectResponse(target, status_code=303)
        self._set_cookie(response, COOKIE, session.session_id, None)
        response.delete_cookie(LOGIN_COOKIE, path="/")
        return response

    async def logout(self, request: Request) -> Response:
        session = self.session_of(request)
        if session is not None:
            form = await request.form(max_files=0, max_fields=4, max_part_size=FORM_FIELD_BYTES_MAX)
            if not self._same_origin(request) or not session.csrf_ok(str(form.get("csrf") or "")):
                return PlainTextResponse("the form's CSRF token is missing or wrong: reload the page", status_code=403)
            self.sessions.drop(session.session_id)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- the charts' data ----------------------------------------------------------

    async def topic_series(self, request: Request) -> Response:
        session = self.session_of(request)
        if session is None:
            return JSONResponse({"error": "UNAUTHENTICATED: log in first"}, status_code=401)
        topic = request.query_params.get("topic", "")

        async def load() -> dict[str, Any]:
            parse_topic(topic)
            return await self.backend.topic_series(session.token, topic)
        data, error = await gather_or_error(load())
        if error is not None:
            return JSONResponse({"error": error}, status_code=_status_of(error))
        return JSONResponse(data)


def _fresh_token() -> str:
    return secrets.token_urlsafe(32)


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bytes(count: int) -> str:
    """`10,485,760 bytes (10 MiB)`: the exact number to type, and its size at a glance."""
    size, unit = float(count), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{count:,} bytes" + ("" if unit == "bytes" else f" ({size:.3g} {unit})")


def _duration(amount: int, unit: str = "ms", unit_ms: int = 1) -> str:
    """`amount` of `unit` (`unit_ms` ms each), and in the largest larger unit it reaches."""
    ms = amount * unit_ms
    for name, length in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if length > unit_ms and ms >= length:
            return f"{amount:,} {unit} ({ms / length:.3g} {name})"
    return f"{amount:,} {unit}"


def _policy_value(value: Any, name: str) -> str:
    """A policy's value as the policies table shows it: 0 is unlimited (never for the
    expirations), byte counts and durations also in larger units."""
    if value is None:
        return ""
    if name in BOOLEAN_POLICIES:
        return "1 (on)" if value else "0 (off)"
    if value == 0:
        return "0 (never)" if name in ZERO_IS_NEVER else "0 (unlimited)"
    if not isinstance(value, int):
        return str(value)
    if name.endswith(("_size", "_bytes_max", "_bytes")):
        return _bytes(value)
    if name.endswith("_ms"):
        return _duration(value)
    if name.endswith("_s"):
        return _duration(value, "s", 1000)
    return f"{value:,}"


# -- pages: what each loads ------------------------------------------------------------


def _query(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise InvalidArgument(f"the page needs ?{name}=")
    return value


# The admin operations (transport/admin_operations.py) each action performs.
ACTIONS: dict[str, tuple[str, ...]] = {
    "/actions/topics/create": ("create_topic",),
    "/actions/topics/delete": ("delete_topic",),
    "/actions/topics/unload": ("unload_topic",),
    "/actions/topics/compact": ("compact_topic",),
    "/actions/topics/policies": ("set_topic_policies", "remove_topic_policies"),
    "/actions/namespaces/policies": ("set_topic_policies", "remove_topic_policies"),
    "/actions/subscriptions/seek": ("seek_subscription",),
}


def _checked_actions(handlers: dict[str, Any]) -> dict[str, Any]:
    """The action handlers, each with its operations in `ACTIONS` (a route with none fails at start)."""
    if set(handlers) != set(ACTIONS):
        raise AssertionError(f"console actions without operations: {sorted(set(handlers) ^ set(ACTIONS))}")
    return handlers


def _routes(console: Console) -> list[Any]:
    backend = console.backend

    async def topic_page(request: Request, session: Session) -> Any:
        topic = _query(request, "name")
        parse_topic(topic)
        return await backend.topic(session.token, topic)

    async def namespace_page(request: Request, session: Session) -> Any:
        namespace = request.path_params["namespace"]
        validate_namespace(namespace)
        return await backend.namespace(session.token, namespace)

    async def subscription_page(request: Request, session: Session) -> Any:
        topic = _query(request, "topic")
        parse_topic(topic)
        return await backend.subscription(session.token, topic, _query(request, "name"))

    async def schema_page(request: Request, session: Session) -> Any:
        return await backend.schema_subject(session.token, _query(request, "subject"))

    # -- actions ----------------------------------------------------------------------

    async def create_topic(session: Session, form: FormData) -> tuple[str, str]:
        namespace = str(form.get("namespace") or "")
        name = str(form.get("name") or "").strip().strip("/")
        topic = f"/{namespace}/{name}"
        partitions = _whole("partitions", str(form.get("partitions") or "0"))
        strategy = DispatchStrategy.RELIABLE if form.get("dispatch") == "reliable" else DispatchStrategy.NON_RELIABLE
        await backend.admin(session.token, lambda c: c.create_topic(topic, partitions, strategy))
        return f"/topic?name={urllib.parse.quote(topic, safe='')}", f"created topic {topic}"

    async def delete_topic(session: Session, form: FormData) -> tuple[str, str]:
        topic = str(form.get("topic") or "")
        namespace = parse_topic(topic).namespace if topic else ""
        if str(form.get("confirm") or "").strip() != topic:
            raise InvalidArgument(f"type the topic's name ({topic}) to confirm the delete")
        await backend.admin(session.token, lambda c: c.delete_topic(topic))
        backend.history.forget(topic)
        return f"/namespaces/{namespace}", f"deleted topic {topic}"

    async def unload_topic(session: Session, form: FormData) -> tuple[str, str]:
        topic = str(form.get("topic") or "")
        await backend.admin(session.token, lambda c: c.unload_topic(topic))
        return f"/topic?name={urllib.parse.quote(topic, safe='')}", f"unloaded topic {topic}: it moved"

    async def compact_topic(session: Session, form: FormData) -> tuple[str, str]:
        topic = str(form.get("topic") or "")
        await backend.admin(session.token, lambda c: c.compact_topic(topic))
        return f"/topic?name={urllib.parse.quote(topic, safe='')}", f"compacting topic {topic}"

    async def apply_policies(session: Session, form: FormData, *, back: str, what: str, fallback: str,
                             remove: Callable[[Any], Awaitable[None]],
                             put: Callable[[Any, dict[str, int | None]], Awaitable[None]]) -> tuple[str, str]:
        if form.get("remove"):
            await backend.admin(session.token, remove)
            return back, f"removed the policies of {what}: {fallback}"
        values = _policy_values(form)
        await backend.admin(session.token, lambda c: put(c, values))
        return back, f"set {', '.join(f'{k}={v}' for k, v in values.items())} on {what}"

    async def topic_policies(session: Session, form: FormData) -> tuple[str, str]:
        topic = str(form.get("topic") or "")
        return await apply_policies(
            session, form, back=f"/topic?name={urllib.parse.quote(topic, safe='')}", what=topic,
            fallback="it follows its namespace's", remove=lambda c: c.remove_topic_policies(topic),
            put=lambda c, values: c.set_topic_policies(topic, **values))

    async def namespace_policies(session: Session, form: FormData) -> tuple[str, str]:
        namespace = str(form.get("namespace") or "")
        validate_namespace(namespace)
        return await apply_policies(
            session, form, back=f"/namespaces/{namespace}", what=f"namespace {namespace}",
            fallback="the broker's defaults apply", remove=lambda c: c.remove_namespace_policies(namespace),
            put=lambda c, values: c.set_namespace_policies(namespace, **values))

    async def seek(session: Session, form: FormData) -> tuple[str, str]:
        topic = str(form.get("topic") or "")
        subscription = str(form.get("subscription") or "")
        value = str(form.get("value") or "").strip()
        if form.get("mode") == "offset":
            offset = _whole("offset", value)
            await backend.admin(session.token, lambda c: c.seek_subscription(topic, subscription, offset=offset))
            where = f"offset {value}"
        else:
            when = _seek_time_ms(value)
            await backend.admin(session.token, lambda c: c.seek_subscription(topic, subscription, publish_time=when))
            where = f"publish time {_when(when) or when}"
        back = (f"/subscription?topic={urllib.parse.quote(topic, safe='')}"
                f"&name={urllib.parse.quote(subscription, safe='')}")
        return back, f"moved subscription {subscription} of {topic} to {where}"

    static = StaticFiles(directory=str(_HERE / "static"))
    plotly_js = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"

    async def plotly(request: Request) -> Response:
        # Plotly's own bundle, as its wheel ships it: no Node toolchain at install.
        return FileResponse(str(plotly_js), media_type="text/javascript",
                            headers={"cache-control": "public, max-age=86400"})

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico on pages that name none (the plain-text refusals).
        return FileResponse(str(_HERE / "static" / "favicon.svg"), media_type="image/svg+xml",
                            headers={"cache-control": "public, max-age=86400"})

    async def root(request: Request) -> Response:
        return RedirectResponse("/cluster", status_code=303)

    return [
        Route("/", root),
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route("/cluster", console.page("Cluster", "cluster.html", lambda r, s: backend.cluster(s.token))),
        Route("/brokers", console.page("Brokers", "brokers.html", lambda r, s: backend.brokers(s.token))),
        Route("/brokers/{broker_id:int}", console.page(
            "Broker", "broker.html", lambda r, s: backend.broker(s.token, r.path_params["broker_id"]))),
        Route("/namespaces", console.page("Namespaces", "namespaces.html",
                                          lambda r, s: backend.namespaces(s.token))),
        Route("/namespaces/{namespace}", console.page("Namespace", "namespace.html", namespace_page)),
        Route("/topics", console.page("Topics", "topics.html", lambda r, s: backend.topics(s.token))),
        Route("/topic", console.page("Topic", "topic.html", topic_page)),
        Route("/subscription", console.page("Subscription", "subscription.html", subscription_page)),
        Route("/schemas", console.page("Schemas", "schemas.html", lambda r, s: backend.schema_subjects(s.token))),
        Route("/schema", console.page("Schema", "schema.html", schema_page)),
        Route("/security", console.page("Security", "security.html", lambda r, s: backend.security(s.token))),
        Route("/api/topic-series", console.topic_series),
        *(Route(path, console.action(run), methods=["POST"]) for path, run in _checked_actions({
            "/actions/topics/create": create_topic, "/actions/topics/delete": delete_topic,
            "/actions/topics/unload": unload_topic, "/actions/topics/compact": compact_topic,
            "/actions/topics/policies": topic_policies,
            "/actions/namespaces/policies": namespace_policies, "/actions/subscriptions/seek": seek}).items()),
        Route("/static/plotly.min.js", plotly),
        Route("/favicon.ico", favicon),
        Mount("/static", static),
    ]


def build_app(settings: ConsoleSettings, *, hosts: frozenset[str], sessions: SessionStore | None = None,
              clock: Callable[[], float] = time.time, secure_cookies: bool = False) -> Starlette:
    """The console app; it answers only to the host names `hosts` (`console_hosts`)."""
    console = Console(settings, sessions=sessions, clock=clock, secure_cookies=secure_cookies)
    app = Starlette(routes=_routes(console))
    app.add_middleware(_SecurityHeaders)
    app.add_middleware(_AllowedHosts, hosts=hosts)
    app.state.console = console
    return app

