"""Per-item cost of typedq.batching.Batcher, old tree against new, interleaved.

    .venv/bin/python bench/batching_micro.py                      # this tree only
    .venv/bin/python bench/batching_micro.py --base /tmp/old-tree  # A B A B ..., medians

C callers each submit items in a loop (as C worker runners settle jobs, or C producers
enqueue) through a Batcher whose send does nothing but yield once (a checkpoint, the
floor of a broker round trip), so the figure is the Batcher's own cost: CPU µs per item.
Each measurement runs in a fresh process with the tree under test first on sys.path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(backend: str, callers: int, items: int) -> dict[str, float]:
    import anyio
    import anyio.lowlevel

    from typedq.batching import Batcher

    async def send(batch: list[int]) -> list[int]:
        await anyio.lowlevel.checkpoint()
        return batch

    async def main() -> dict[str, float]:
        batcher: Batcher[int, int] = Batcher(send)
        per_caller = items // callers

        async def caller() -> None:
            for i in range(per_caller):
                await batcher.submit(i)

        async with anyio.create_task_group() as tg:
            await tg.start(batcher.run)
            async with anyio.create_task_group() as warm:  # warm up
                for _ in range(callers):
                    warm.start_soon(caller)
            wall, cpu = time.perf_counter(), time.process_time()
            async with anyio.create_task_group() as work:
                for _ in range(callers):
                    work.start_soon(caller)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tg.cancel_scope.cancel()
        done = per_caller * callers
        return {"cpu_us_per_item": cpu / done * 1e6, "wall_us_per_item": wall / done * 1e6}

    return anyio.run(main, backend=backend)


def child(tree: str, backend: str, callers: int, items: int) -> dict[str, float]:
    code = (
        f"import sys; sys.path.insert(0, {tree!r}); sys.path.insert(0, {str(ROOT / 'bench')!r});"
        "import json, batching_micro as b;"
        f"print(json.dumps(b.measure({backend!r}, {callers}, {items})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/"
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="another checkout to compare against (old code)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--callers", default="1,16,256")
    parser.add_argument("--backends", default="asyncio,trio")
    args = parser.parse_args()
    trees = {"new": str(ROOT)}
    if args.base:
        trees = {"old": str(Path(args.base).resolve()), **trees}
    for backend in args.backends.split(","):
        for callers in (int(c) for c in args.callers.split(",")):
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(args.reps):  # interleaved: old new old new ...
                for name, tree in trees.items():
                    runs[name].append(child(tree, backend, callers, args.items))
            line = [f"{backend:8} C={callers:<4}"]
            medians = {}
            for name, results in runs.items():
                cpu = statistics.median(r["cpu_us_per_item"] for r in results)
                wall = statistics.median(r["wall_us_per_item"] for r in results)
                medians[name] = cpu
                line.append(f"{name}: {cpu:6.2f} µs CPU/item ({wall:6.2f} wall)")
            if "old" in medians:
                line.append(f"new/old CPU {medians['new'] / medians['old']:.2f}x")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
