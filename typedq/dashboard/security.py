"""Who may act: read-only without a token; with one, a login sets a signed session
cookie, and every POST carries that session's CSRF token.

- No token configured: no action is offered and every POST answers 403.
- Token configured: ``POST /login`` with the token (compared in constant time) sets the
  cookie ``typedq_dashboard``: ``<session id>.<HMAC>``, HttpOnly, SameSite=Strict. The
  signing key is derived from the token, so changing the token logs everyone out.
- Every other POST must carry a valid session cookie and the form field ``csrf``, the
  HMAC of the session id under a second derived key: a page of another site cannot read
  it, so a forged post fails (403) even where a browser would send the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["COOKIE", "Guard"]

#: The session cookie's name.
COOKIE = "typedq_dashboard"


def _derive(token: str, purpose: str) -> bytes:
    return hmac.new(token.encode(), f"typedq-dashboard:{purpose}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class Guard:
    """Sessions and CSRF tokens for one dashboard.

    :param token: the operator token; ``None`` (or empty) makes the dashboard read-only
    """

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        secret = self.token or secrets.token_hex(16)
        self._session_key = _derive(secret, "session")
        self._csrf_key = _derive(secret, "csrf")

    @property
    def read_only(self) -> bool:
        """True when no token is configured: nothing can be changed from the dashboard."""
        return self.token is None

    def check_token(self, given: str) -> bool:
        """Whether ``given`` is the configured token (constant-time comparison)."""
        if self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def new_session(self) -> str:
        """A fresh signed session cookie value."""
        session = secrets.token_hex(16)
        return f"{session}.{_mac(self._session_key, session)}"

    def session(self, cookie: str | None) -> str | None:
        """The session id of a valid cookie, else None (always None when read-only)."""
        if self.token is None or not cookie:
            return None
        session, _, mac = cookie.partition(".")
        if not session or not hmac.compare_digest(mac, _mac(self._session_key, session)):
            return None
        return session

    def csrf(self, session: str) -> str:
        """The CSRF token of a session (put in every form of its pages)."""
        return _mac(self._csrf_key, session)

    def allows(self, cookie: str | None, csrf: str | None) -> bool:
        """Whether a POST with this cookie and form ``csrf`` field may act."""
        session = self.session(cookie)
        if session is None or not csrf:
            return False
        return hmac.compare_digest(csrf, self.csrf(session))
