"""The contract suite runs once per broker: memory (asyncio, trio) and Redis (asyncio)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend(broker_backend_name: str) -> str:
    return broker_backend_name
