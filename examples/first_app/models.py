"""The models of the first app: what crosses the queue, checked at both ends."""

from __future__ import annotations

import msgspec


class Signup(msgspec.Struct):
    user_id: int
    email: str


class Welcomed(msgspec.Struct):
    user_id: int
    message_id: str
    attempts: int
