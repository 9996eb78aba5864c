"""Enqueue a welcome and wait for its result: python -m examples.first_app.enqueue"""

from __future__ import annotations

import anyio

from .models import Signup
from .tasks import app, welcome


async def main() -> None:
    async with app:  # connects to the broker
        job = await welcome.enqueue(Signup(user_id=7, email="ada@example.com"))
        result = await job.result(timeout=30)  # mypy: Welcomed
        print(f"{job.id} -> {result}")


if __name__ == "__main__":
    anyio.run(main)
