"""The model check of tests/model/test_model_check.py on Redis Cluster: the same seeds,
step by step against the embedded broker (the reference).

A file of its own so that ``--dist loadfile`` runs it on another process than the single
Redis half (the two are the suite's longest CPU-bound files).
"""

from __future__ import annotations

import pytest

from tests.model import test_model_check as model

pytestmark = pytest.mark.anyio


@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.asyncio_only
@pytest.mark.parametrize("seed", model.SEEDS)
async def test_cluster_follows_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    await model.check_seed(request, app_name, "cluster", seed)


@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.asyncio_only
@pytest.mark.parametrize("seed", model.FAIR_SEEDS)
async def test_cluster_fair_shares_follow_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    """Fair jobs (typedq.fair), with their hand-backs and retries, on Cluster."""
    await model.check_seed(request, app_name, "cluster", seed, fair=True)
