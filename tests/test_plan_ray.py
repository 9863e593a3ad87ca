"""The same small plan on a local Ray runtime and in a local process pool: the same ranking."""

from __future__ import annotations

import pytest
from test_plan import small_plan, top

from pp_opt.planner import PoolExecutor, RayExecutor

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_and_the_pool_rank_alike() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = small_plan(executor=RayExecutor(None, workers=2))
    finally:
        ray.shutdown()
    pool = PoolExecutor(2)
    try:
        on_pool = small_plan(executor=pool)
    finally:
        pool.close()
    assert top(on_ray) == top(on_pool)
