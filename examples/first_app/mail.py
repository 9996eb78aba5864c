"""Stands for the client of a mail service (an HTTP client in real life): opened once per
worker, shared by every job, closed at shutdown."""

from __future__ import annotations


class Mailer:
    def __init__(self, sender: str) -> None:
        self.sender = sender
        self.sent = 0
        self.closed = False

    async def send(self, to: str, subject: str) -> str:
        """Send a message; returns its id."""
        self.sent += 1
        return f"msg-{self.sent}"

    async def aclose(self) -> None:
        self.closed = True
