"""Who may act: read-only without a token; with one, a login sets a signed session
cookie, and every POST carries that session's CSRF token.

- No token configured: no action is offered and every POST answers 403.
- Token configured: ``POST /login`` with the token (compared in constant time) sets the
  cookie ``typedq_dashboard``: ``<session id>.<expiry>.<HMAC>``, HttpOnly,
  SameSite=Strict. The signing key is derived from the token, so changing the token logs
  everyone out. A session expires ``session_ttl`` seconds after its login (8 hours by
  default); ``POST /logout`` revokes it in this process (a copy of the cookie no longer
  works there; a dashboard of several processes revokes per process, and expiry bounds
  the rest).
- Failed logins are limited per client address: after ``LOGIN_ATTEMPTS`` failures within
  ``LOGIN_WINDOW`` seconds, ``POST /login`` answers 429 until the window has passed.
- Every other POST must carry a valid session cookie and the form field ``csrf``, the
  HMAC of the session id under a second derived key: a page of another site cannot read
  it, so a forged post fails (403) even where a browser would send the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

__all__ = ["COOKIE", "LOGIN_ATTEMPTS", "LOGIN_WINDOW", "SESSION_TTL", "Guard"]

#: The session cookie's name.
COOKIE = "typedq_dashboard"
#: Seconds a session lasts after its login, by default.
SESSION_TTL = 8 * 3600.0
#: Failed logins a client address may make within LOGIN_WINDOW seconds.
LOGIN_ATTEMPTS = 5
LOGIN_WINDOW = 60.0
#: Client addresses whose failures are remembered at most (oldest forgotten first).
_MAX_CLIENTS = 10_000


def _derive(token: str, purpose: str) -> bytes:
    return hmac.new(token.encode(), f"typedq-dashboard:{purpose}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class Guard:
    """Sessions, CSRF tokens and the login limit of one dashboard.

    :param token: the operator token; ``None`` (or empty) makes the dashboard read-only
    :param session_ttl: seconds a session lasts after its login
    :param clock: the wall clock (epoch seconds); tests pass a FakeClock
    """

    def __init__(
        self,
        token: str | None,
        *,
        session_ttl: float = SESSION_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not session_ttl > 0:
            raise ValueError(f"session_ttl must be > 0 seconds, got {session_ttl}")
        self.token = token or None
        self.session_ttl = session_ttl
        self.clock = clock
        secret = self.token or secrets.token_hex(16)
        self._session_key = _derive(secret, "session")
        self._csrf_key = _derive(secret, "csrf")
        #: Revoked sessions -> their expiry (dropped once expired: bounded by logins).
        self._revoked: dict[str, float] = {}
        #: Client address -> times of its recent failed logins.
        self._failures: dict[str, list[float]] = {}

    @property
    def read_only(self) -> bool:
        """True when no token is configured: nothing can be changed from the dashboard."""
        return self.token is None

    def check_token(self, given: str) -> bool:
        """Whether ``given`` is the configured token (constant-time comparison)."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def login_wait(self, client: str) -> float:
        """Seconds ``client`` must wait before it may try to log in again (0: now)."""
        now = self.clock()
        recent = [t for t in self._failures.get(client, ()) if t > now - LOGIN_WINDOW]
        if recent:
            self._failures[client] = recent
        else:
            self._failures.pop(client, None)
        if len(recent) < LOGIN_ATTEMPTS:
            return 0.0
        return max(0.0, recent[-LOGIN_ATTEMPTS] + LOGIN_WINDOW - now)

    def login_failed(self, client: str) -> None:
        """Count a failed login of ``client``."""
        if client not in self._failures and len(self._failures) >= _MAX_CLIENTS:
            self._failures.pop(next(iter(self._failures)))
        self._failures.setdefault(client, []).append(self.clock())

    def new_session(self) -> str:
        """A fresh signed session cookie value, valid for ``session_ttl`` seconds."""
        session = secrets.token_hex(16)
        signed = f"{session}.{int(self.clock() + self.session_ttl)}"
        return f"{signed}.{_mac(self._session_key, signed)}"

    def session(self, cookie: str | None) -> str | None:
        """The session id of a valid cookie (signed, not expired, not revoked), else None
        (always None when read-only)."""
        if self.token is None or not cookie:
            return None
        signed, _, mac = cookie.rpartition(".")
        session, _, expires = signed.partition(".")
        if not session or not expires.isdigit():
            return None
        if not hmac.compare_digest(mac, _mac(self._session_key, signed)):
            return None
        if int(expires) <= self.clock() or session in self._revoked:
            return None
        return session

    def revoke(self, cookie: str | None) -> None:
        """End the session of ``cookie`` in this process (logout)."""
        session = self.session(cookie)
        if session is None:
            return
        now = self.clock()
        for old in [s for s, until in self._revoked.items() if until <= now]:
            del self._revoked[old]
        self._revoked[session] = now + self.session_ttl

    def csrf(self, session: str) -> str:
        """The CSRF token of a session (put in every form of its pages)."""
        return _mac(self._csrf_key, session)

    def allows(self, cookie: str | None, csrf: str | None) -> bool:
        """Whether a POST with this cookie and form ``csrf`` field may act."""
        session = self.session(cookie)
        if session is None or not csrf:
            return False
        return hmac.compare_digest(csrf, self.csrf(session))
