"""The model check's runs (tests/model/test_model_check.py) on PostgreSQL: the same
seeds, plain and fair, step by step against the embedded broker (a file of its own, so
that ``--dist loadfile`` runs it on a process of its own)."""

from __future__ import annotations

import pytest

from tests.model.test_model_check import FAIR_SEEDS, SEEDS, check_seed

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("seed", SEEDS)
async def test_postgres_follows_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    await check_seed(request, app_name, "postgres", seed)


@pytest.mark.parametrize("seed", FAIR_SEEDS)
async def test_postgres_fair_shares_follow_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    """The same with fair jobs: keys whose weights change, hand-backs, retries, cancels
    and removes of waiting fair jobs (their ghosts), several priority levels."""
    await check_seed(request, app_name, "postgres", seed, fair=True)
