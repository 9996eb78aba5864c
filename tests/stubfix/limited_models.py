"""Models of tests/stubfix/limited.py (stubs import models, never handlers)."""

from __future__ import annotations

import msgspec


class Call(msgspec.Struct, frozen=True):
    tenant: str
