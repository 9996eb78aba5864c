"""Security: no unsafe deserialization in the package; apps on one Redis stay apart."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import msgspec
import pytest

from tests.redis_harness import RedisProcess, flushall
from typedq import App, JobState

PACKAGE = Path(__file__).resolve().parents[2] / "typedq"


class Note(msgspec.Struct):
    text: str


def test_no_unsafe_deserialization_or_dynamic_code_in_the_package() -> None:
    """RELIABILITY G4: nothing on a data path can unpickle, unmarshal or eval."""
    forbidden = re.compile(r"\b(pickle|marshal|shelve|cloudpickle|dill)\b|\beval\(|\bexec\(")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if forbidden.search(code):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_apps_on_one_redis_never_take_each_others_jobs(
    redis_server: RedisProcess, anyio_backend: str
) -> None:
    """RELIABILITY G5 (sidekiq#1414): same queue and task names, separate namespaces."""
    flushall(redis_server.port)
    ran: dict[str, list[str]] = {"alpha": [], "beta": []}

    def make(name: str) -> App:
        app = App(name, broker=redis_server.url)

        @app.task(name="remember")
        async def remember(note: Note) -> None:
            ran[name].append(note.text)

        return app

    alpha, beta = make("alpha"), make("beta")
    with anyio.fail_after(20):
        async with alpha, beta, alpha.worker(concurrency=4):
            for i in range(20):
                await alpha.tasks["remember"].enqueue(Note(text=f"a{i}"))
                await beta.tasks["remember"].enqueue(Note(text=f"b{i}"))
            while len(ran["alpha"]) < 20:  # noqa: ASYNC110 -- bounded by fail_after
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # time enough to (wrongly) take beta's jobs
            beta_counts = await beta.broker.counts("default")
    assert sorted(ran["alpha"]) == sorted(f"a{i}" for i in range(20))
    assert ran["beta"] == []
    assert beta_counts[JobState.WAITING] == 20
