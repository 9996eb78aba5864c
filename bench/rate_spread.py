"""Where a rate limit holds: handler starts of RateLimit(50, per=1.0) (issue 24 defect 2).

200 jobs, two worker processes at concurrency 32 on one redis-server; each handler records
its start (this host's clock, at handler entry). Prints the starts per 100 ms, the worst
one-second window of starts (SPEC: at most 50) and the rate. Run it on two commits to
compare: ``python -m bench.rate_spread``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import redis

from bench.limits_bench import worst_window
from bench.rate_spread_app import Tick, app, paced
from bench.redis_server import redis_server

JOBS = 200


def main() -> None:
    with redis_server() as server:
        url, ledger = f"{server.url}/0", f"{server.url}/1"
        env = {**os.environ, "RATE_SPREAD_LEDGER": ledger}
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "typedq",
                    "worker",
                    "bench.rate_spread_app:app",
                    "--concurrency",
                    "32",
                    "--broker",
                    url,
                ],
                env=env,
            )
            for _ in range(2)
        ]
        try:
            time.sleep(2.0)  # both workers up and waiting

            async def produce() -> None:
                app.use_broker(url)
                async with app:
                    jobs = await paced.enqueue_many(Tick(i) for i in range(JOBS))
                    for job in jobs:
                        await job.result(timeout=120)

            anyio.run(produce)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(timeout=30)
        entered = [float(t) for t in redis.Redis.from_url(ledger).lrange("entered", 0, -1)]
    first = min(entered)
    buckets: dict[int, int] = {}
    for t in entered:
        buckets[int((t - first) * 10)] = buckets.get(int((t - first) * 10), 0) + 1
    span = max(entered) - first
    print(f"{len(entered)} handler starts over {span:.2f} s ({len(entered) / span:.1f}/s)")
    print("starts per 100 ms (from the first start):")
    for b in range(max(buckets) + 1):
        n = buckets.get(b, 0)
        print(f"  {b / 10:5.1f} s  {n:3d}  {'#' * n}")
    worst = worst_window([round(t * 1_000_000) for t in entered], 1_000_000)
    print(f"worst one-second window of starts: {worst} (limit 50)")


if __name__ == "__main__":
    main()
