"""What exact per-fingerprint job counts would cost (issue 28): ``typedq verify`` counts
jobs per fingerprint by a bounded sample scan; exact counts need a counter updated on
every job's way in (enqueue) and out (complete, fail, cancel, remove, purge, retention).

Measures, on a fresh redis-server of its own, the server time (INFO commandstats) of
the real scripts per job, next to one ``HINCRBY`` per job inside a script (the least a
counter costs when a script updates it job by job):

- the enqueue script, batches of ``--batch`` jobs;
- claim + complete of those jobs, batches of ``--batch``;
- a script doing ``--batch`` HINCRBYs on a hash of 50 fields;
- the same counts summed in Lua first, one HINCRBY per distinct field (50) per call.

Changes nothing in typedq. Run: ``.venv/bin/python -m bench.fingerprint_count_cost
[--jobs 100000 --batch 500]``.
"""

from __future__ import annotations

import argparse

import anyio
import redis.asyncio as aioredis

from bench.redis_server import redis_server
from tests.support import msg
from typedq import App
from typedq.broker.base import Completion

_HINCRBY = """
for i = 1, tonumber(ARGV[1]) do
  redis.call('HINCRBY', KEYS[1], 'task' .. (i % 50) .. '|0123456789abcdef', 1)
end
return 0
"""

#: The same counts summed in the script first: one HINCRBY per distinct key per call
#: (a batch of one task's jobs: one).
_SUMMED = """
local sums = {}
for i = 1, tonumber(ARGV[1]) do
  local k = 'task' .. (i % 50) .. '|0123456789abcdef'
  sums[k] = (sums[k] or 0) + 1
end
for k, n in pairs(sums) do redis.call('HINCRBY', KEYS[1], k, n) end
return 0
"""


async def _usec(r: aioredis.Redis, command: str) -> float:
    stats = await r.info("commandstats")
    return float(stats.get(f"cmdstat_{command}", {}).get("usec", 0))


async def main(url: str, jobs: int, batch: int) -> None:
    r = aioredis.Redis.from_url(url)
    app = App("countcost", broker=url)
    async with app:
        broker = app.broker
        await r.config_resetstat()
        for _ in range(jobs // batch):
            await broker.enqueue([msg() for _ in range(batch)])
        enqueue = await _usec(r, "fcall") / jobs
        await r.config_resetstat()
        done = 0
        while done < jobs:
            claimed = await broker.claim(["q"], batch, worker_id="w", lease=60)
            if not claimed:
                break
            await broker.complete([Completion(c.message.id, c.token, b"") for c in claimed])
            done += len(claimed)
        settle = await _usec(r, "fcall") / max(done, 1)
    sha = await r.script_load(_HINCRBY)
    await r.config_resetstat()
    for _ in range(jobs // batch):
        await r.evalsha(sha, 1, "countcost:fp", str(batch))  # type: ignore[misc]
    counter = await _usec(r, "evalsha") / jobs
    sha = await r.script_load(_SUMMED)
    await r.config_resetstat()
    for _ in range(jobs // batch):
        await r.evalsha(sha, 1, "countcost:fp", str(batch))  # type: ignore[misc]
    summed = await _usec(r, "evalsha") / jobs
    await r.aclose()
    print(f"{jobs:,} jobs, batches of {batch}: server time per job")
    print(f"  enqueue script:           {enqueue:6.2f} us")
    print(f"  claim + complete scripts: {settle:6.2f} us")
    print(f"  one HINCRBY in a script:  {counter:6.2f} us")
    print(f"  summed, 50 HINCRBY a call:{summed:6.2f} us")
    print(
        f"  a counter per job would add {counter / enqueue:.0%} to enqueue and "
        f"{counter / settle:.0%} to claim + complete (each way out needs its decrement); "
        f"summed per call: {summed / enqueue:.0%} and {summed / settle:.0%}"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    with redis_server() as server:
        anyio.run(main, server.url, args.jobs, args.batch)


if __name__ == "__main__":
    cli()
