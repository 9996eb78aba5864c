"""Tests of the first app: retries on a fake clock, a test double for the mailer."""

from __future__ import annotations

import pytest

from typedq.testing import job_context, provide, run_worker

from .mail import Mailer
from .models import Signup, Welcomed
from .tasks import app, mailer, welcome

pytestmark = pytest.mark.anyio  # async tests, on asyncio (and on trio if installed)


class FlakyMailer(Mailer):
    """Fails its first sends, like a mail service having a bad minute."""

    def __init__(self, failures: int) -> None:
        super().__init__(sender="test@example.com")
        self.failures = failures

    async def send(self, to: str, subject: str) -> str:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("mail service unavailable")
        return await super().send(to, subject)


async def test_welcome_is_retried_until_the_mailer_recovers() -> None:
    flaky = FlakyMailer(failures=2)
    async with run_worker(app, resources=[provide(mailer, flaky)]) as harness:
        job = await welcome.enqueue(Signup(user_id=1, email="ada@example.com"))
        await harness.idle()  # attempt 1 failed: attempt 2 is due in 60 s
        assert (await job.info()).attempt == 1
        await harness.advance(60)  # no real waiting: the fake clock moves
        await harness.idle()  # attempt 2 failed too
        await harness.advance(60)
        await harness.idle()  # attempt 3 succeeded
        result = await job.result(timeout=5)
    assert result == Welcomed(user_id=1, message_id="msg-1", attempts=3)


async def test_welcome_called_directly() -> None:
    ctx = job_context(provide(mailer, Mailer(sender="test@example.com")))
    result = await welcome(Signup(user_id=2, email="bob@example.com"), ctx)
    assert result == Welcomed(user_id=2, message_id="msg-1", attempts=1)
