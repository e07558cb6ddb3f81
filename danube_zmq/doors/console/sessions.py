"""The console's browser sessions: who is logged in, with which Danube token, and the
CSRF token their forms must carry. Pure (the clock is passed in), bounded in count.

The token stays on the server: the browser holds only a random session id in an
HttpOnly, SameSite=Strict cookie, so a script on another origin can neither read the
token nor ride the session, and a stolen cookie dies with the session's idle timeout.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from collections import OrderedDict

__all__ = ["Session", "SessionStore"]

# Messages shown once after an action (the page it redirects to): at most this many kept.
FLASHES_MAX = 8


@dataclasses.dataclass(slots=True)
class Session:
    session_id: str
    # None: logged in without a token (only possible where the broker lets anonymous
    # callers read: security off).
    token: str | None
    csrf: str
    created_s: float
    last_seen_s: float
    flashes: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def flash(self, kind: str, text: str) -> None:
        self.flashes = (self.flashes + [(kind, text)])[-FLASHES_MAX:]

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


class SessionStore:
    """At most `sessions_max` sessions; a new one past it evicts the least recently
    seen. A session ends `idle_s` after its last request, and `lifetime_s` after login
    whatever its use."""

    def __init__(self, *, sessions_max: int = 1000, idle_s: float = 1800.0, lifetime_s: float = 12 * 3600.0) -> None:
        if sessions_max < 1:
            raise ValueError(f"sessions_max must be >= 1, got {sessions_max}")
        self.sessions_max = sessions_max
        self.idle_s = idle_s
        self.lifetime_s = lifetime_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, token: str | None, now_s: float) -> Session:
        while len(self._sessions) >= self.sessions_max:
            self._sessions.popitem(last=False)
        session = Session(session_id=secrets.token_urlsafe(32), token=token, csrf=secrets.token_urlsafe(32),
                          created_s=now_s, last_seen_s=now_s)
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None, now_s: float) -> Session | None:
        """The live session of `session_id`, marked seen now; None (and the session
        forgotten) when it is unknown, idle too long or too old."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if now_s - session.last_seen_s > self.idle_s or now_s - session.created_s > self.lifetime_s:
            del self._sessions[session_id]
            return None
        session.last_seen_s = now_s
        self._sessions.move_to_end(session_id)
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)
