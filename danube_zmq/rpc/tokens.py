"""Where a client's JWT comes from: a fixed token, or a provider called for a new one.

The token goes in the session's `Connect.auth_token` (docs/security.md, "Clients"). A
provider (a callable, sync or async, returning the token as a str) is called at every
`Connect` and whenever the broker answers UNAUTHENTICATED (the token expired or was
revoked); a fixed token is sent as it is, and an UNAUTHENTICATED answer is the caller's.

A token is a bearer secret: nothing here logs it, and `repr` never shows it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Mapping

from danube_zmq.transport.errors import DanubeError, InvalidArgument, Unauthenticated

__all__ = ["ENV_TOKEN", "TokenProvider", "TokenSource", "read_token_file", "token_source"]

ENV_TOKEN = "DANUBE_TOKEN"

TokenProvider = Callable[[], "str | Awaitable[str]"]

TOKEN_CHARS_MAX = 16 * 1024
"""Longer than any JWT we mint by far (an RS256 token with our claims is ~700 chars);
a longer one is a mistake (a file of something else), refused before it is sent."""


class TokenSource:
    """A fixed token or a provider; `renewable` when a new token can be asked for."""

    __slots__ = ("_provider", "_token")

    def __init__(self, *, token: str | None = None, provider: TokenProvider | None = None) -> None:
        if (token is None) == (provider is None):
            raise InvalidArgument("give a token or a token_provider (exactly one)")
        if provider is not None and not callable(provider):
            raise InvalidArgument(f"token_provider must be callable, got a {type(provider).__name__}")
        self._token = _checked(token, "token") if token is not None else None
        self._provider = provider

    @property
    def renewable(self) -> bool:
        return self._provider is not None

    async def get(self) -> str:
        """The token to send now: the fixed one, or the provider's answer (asked every
        time: a provider decides itself whether to cache). A provider that raises or
        answers something other than a token is `Unauthenticated`, naming what it did."""
        if self._provider is None:
            assert self._token is not None
            return self._token
        try:
            token = self._provider()
            if inspect.isawaitable(token):
                token = await token
        except Exception as exc:
            raise Unauthenticated(f"token_provider raised {type(exc).__name__}: {exc}") from exc
        return _checked(token, "token_provider's answer", error=Unauthenticated)

    def __repr__(self) -> str:
        return "<TokenSource provider>" if self._provider is not None else "<TokenSource fixed token>"


def token_source(token: str | None = None, token_provider: TokenProvider | None = None, *,
                 env: Mapping[str, str] | None = None) -> TokenSource | None:
    """A client's token source, or None (no token: a broker in security.mode none, or one
    that knows the client by its CURVE key). Without either argument, DANUBE_TOKEN from
    `env` when given (an empty value counts as none)."""
    if token is not None and token_provider is not None:
        raise InvalidArgument("give a token or a token_provider, not both")
    if token is None and token_provider is None and env is not None:
        token = env.get(ENV_TOKEN) or None
    if token is None and token_provider is None:
        return None
    return TokenSource(token=token, provider=token_provider)


def read_token_file(path: str) -> str:
    """A token from a file (one line; surrounding blanks and the newline dropped), so that
    it is not on a command line where `ps` shows it."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(TOKEN_CHARS_MAX + 2)
    except OSError as exc:
        raise InvalidArgument(f"cannot read the token file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidArgument(f"the token file {path!r} is not text") from None
    return _checked(text.strip(), f"the token in {os.fspath(path)!r}")


def _checked(token: object, what: str, error: type[DanubeError] = InvalidArgument) -> str:
    # The value itself is never quoted in the message: it may be a valid secret.
    if not isinstance(token, str):
        raise error(f"{what} must be a str, got a {type(token).__name__}")
    if not token or token != token.strip() or any(c.isspace() for c in token):
        raise error(f"{what} must be one non-empty word without blanks (a JWT)")
    if len(token) > TOKEN_CHARS_MAX:
        raise error(f"{what} is {len(token)} characters, over {TOKEN_CHARS_MAX}: not a JWT")
    return token
