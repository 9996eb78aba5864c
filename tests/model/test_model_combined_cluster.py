"""The combined model check of tests/model/test_model_combined.py on Redis Cluster: the
same seeds' programs (less what Cluster documents it does differently: for_cluster), in
lockstep with the embedded broker (the reference).

A file of its own so that ``--dist loadfile`` runs it on another process than the single
Redis half (the two are the suite's longest CPU-bound files).
"""

from __future__ import annotations

import pytest

from tests.model import test_model_combined as model

pytestmark = pytest.mark.anyio


@pytest.mark.asyncio_only
@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.parametrize("seed", model.SEEDS)
async def test_cluster_agrees_where_features_meet(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    await model.check_seed(request, app_name, "cluster", seed)
