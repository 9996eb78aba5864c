"""The first app of docs/first-app.md: one task with retries, reading a resource."""

from __future__ import annotations

from collections.abc import AsyncIterator

from typedq import App, Backoff, JobContext

from .mail import Mailer
from .models import Signup, Welcomed

app = App("first-app")  # the embedded broker, or the URL in $TYPEDQ_BROKER


@app.resource
async def mailer() -> AsyncIterator[Mailer]:
    client = Mailer(sender="hello@example.com")  # opened once, when a worker starts
    try:
        yield client
    finally:
        await client.aclose()  # when the worker shuts down, after its last job


@app.task(
    retries=3,
    backoff=Backoff(kind="fixed", base=60, jitter=0),  # retry after 60 s, 60 s, 60 s
    key=lambda signup: f"user-{signup.user_id}",  # one welcome per user: the job id
)
async def welcome(signup: Signup, ctx: JobContext) -> Welcomed:
    message_id = await ctx.get(mailer).send(signup.email, "Welcome!")  # mypy: Mailer
    return Welcomed(user_id=signup.user_id, message_id=message_id, attempts=ctx.attempt)
