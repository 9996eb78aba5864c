"""Waiting for a result rides out a Redis outage shorter than its timeout (issue 29, item
2): a real redis-server is killed and restarted while ``job.result()`` waits; the wait
logs once when the broker becomes unreachable and once when it answers again, and
raises BrokerUnavailable (saying how long it tried) only when its own timeout is spent."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import anyio
import pytest

from tests.redis_harness import RedisProcess, redis_process, subscribers
from tests.support import In, Out
from typedq import App, BrokerUnavailable

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    with redis_process(appendonly=True) as process:
        yield process


def job_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "typedq.job" and text in r.message]


async def until(check: object, seconds: float = 30.0) -> None:
    """Poll ``check()`` (another process's state: no event to wait on) until true."""
    assert callable(check)
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 -- the state is another process's
            await anyio.sleep(0.02)


async def test_result_rides_out_a_redis_restart(
    server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="typedq.job")
    app = App("outage", broker=server.url)

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    got: list[Out | BaseException] = []

    async def wait() -> None:
        try:
            got.append(await double_job.result(timeout=60))
        except Exception as exc:
            got.append(exc)

    with anyio.fail_after(90):
        async with app:
            double_job = await double.enqueue(In(21))
            done_channel = app.broker._notes.done_channel("default")  # type: ignore[attr-defined]
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                # The waiter is armed once it listens for finishes.
                await until(lambda: subscribers(server.port, done_channel) > 0)
                server.kill()
                await until(lambda: job_lines(caplog, "unreachable"))
                assert not got, got  # still waiting, through the outage
                server.start()
                async with app.worker(concurrency=1):
                    await until(lambda: bool(got))
    (result,) = got
    assert result == Out(42)
    (down,) = job_lines(caplog, "unreachable")
    assert double_job.id in down
    assert "for up to 60 s" in down
    (up,) = job_lines(caplog, "answers again")
    assert double_job.id in up


async def test_result_gives_up_with_broker_unavailable_when_its_timeout_is_spent(
    server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="typedq.job")
    app = App("outage", broker=server.url)

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    with anyio.fail_after(60):
        async with app:
            job = await double.enqueue(In(1))
            server.kill()
            started = anyio.current_time()
            with pytest.raises(BrokerUnavailable) as caught:
                await job.result(timeout=2)
            tried = anyio.current_time() - started
    # It kept trying for the whole timeout (not the first failure's ~1 s), and stopped
    # soon after it (one look's grace).
    assert 2 <= tried < 2 + 5
    text = str(caught.value)
    assert "unreachable" in text
    assert f"127.0.0.1:{server.port}" in text
    assert "through the result's timeout of 2 s" in text
    assert job.id in text
    assert len(job_lines(caplog, "unreachable")) == 1
    assert not job_lines(caplog, "answers again")
