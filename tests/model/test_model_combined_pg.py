"""The combined model check of tests/model/test_model_combined.py on PostgreSQL: the same
seeds' programs in lockstep with the embedded broker (the reference), step by step.

A file of its own so that ``--dist loadfile`` runs it beside the Redis and Cluster halves.
"""

from __future__ import annotations

import pytest

from tests.model import test_model_combined as model

pytestmark = pytest.mark.anyio


@pytest.mark.asyncio_only
@pytest.mark.postgres
@pytest.mark.parametrize("seed", model.SEEDS)
async def test_postgres_agrees_where_features_meet(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    await model.check_seed(request, app_name, "postgres", seed)
