"""typedq durable runs for bench/durable.py: runs in the project venv.

One process: ``RUNS`` runs of a durable function of ``STEPS`` steps (each a no-op task of
the app, ``run.step``), started ``CONCURRENCY`` at a time (``await onboard.start(...)``, then
``await handle.result()``), with ``app.worker(concurrency=CONCURRENCY)`` in the same
process, as DBOS runs its workflows in the process that starts them. Prints one JSON line.

Usage: ``python -m bench.adapters.durable_typedq '{"broker": URL, "runs": 1000, ...}'``
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import anyio
import msgspec

from typedq import App, Run


class Step(msgspec.Struct):
    n: int


class Job(msgspec.Struct):
    steps: int


class Done(msgspec.Struct):
    total: int


def build(broker: str) -> tuple[App, object]:
    app = App("durbench", broker=broker)

    @app.task(retries=0)
    async def add_one(x: Step) -> Step:
        return Step(x.n + 1)

    @app.durable
    async def pipeline(run: Run, job: Job) -> Done:
        value = Step(0)
        for _ in range(job.steps):
            value = await run.step(add_one, value)
        return Done(value.n)

    return app, pipeline


async def main(params: dict[str, object]) -> dict[str, object]:
    broker = str(params["broker"])
    runs = int(str(params["runs"]))
    steps = int(str(params["steps"]))
    concurrency = int(str(params["concurrency"]))
    app, pipeline = build(broker)
    latencies: list[float] = []
    limiter = anyio.Semaphore(concurrency)
    prefix = f"r{time.time_ns()}"

    async def one(i: int) -> None:
        async with limiter:
            started = time.perf_counter()
            handle = await pipeline.start(Job(steps), run_id=f"{prefix}-{i}")  # type: ignore[attr-defined]
            done = await handle.result(timeout=120)
            assert done.total == steps, done
            latencies.append(time.perf_counter() - started)

    async with app, app.worker(concurrency=concurrency):
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(one, i)
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {
        "system": "typedq",
        "broker": broker.split(":", 1)[0],
        "runs": runs,
        "steps": steps,
        "concurrency": concurrency,
        "seconds": elapsed,
        "runs_per_s": runs / elapsed,
        "steps_per_s": runs * steps / elapsed,
        "run_p50_ms": 1000 * statistics.median(latencies),
        "run_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, json.loads(sys.argv[1]))), flush=True)
