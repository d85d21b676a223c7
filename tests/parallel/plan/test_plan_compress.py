"""The planner's dp communication under compression and local SGD (parallel.plan.compress)."""
import math

import numpy as np
import pytest

from minitensor.models.gpt import GPT
from parallel.data_parallel.comm_hooks import PowerSGD
from parallel.plan import Layout, estimate, get_config
from parallel.plan.compress import dp_time, stage_matrices

PROFILE = {"name": "test", "peak_flops": {"float32": 1e12}, "memory_gib": 8, "devices_per_node": 1,
           "intra": {"alpha_us": 1.0, "bandwidth_gbps": 1.0}, "inter": {"alpha_us": 50.0, "bandwidth_gbps": 0.1},
           "efficiency": 0.5}


def test_the_planner_sees_the_matrices_the_model_has():
    config = get_config("small")
    model = GPT(config)
    real = sorted((p.shape[0], math.prod(p.shape[1:])) for p in model.parameters() if p.ndim >= 2)
    assert sorted(stage_matrices(config, 1, 1, 0)) == real


def dp_seconds(compress, local_steps=1, dp=4):
    est = estimate(get_config("small"), Layout(dp=dp), 16, PROFILE, compress=compress, local_steps=local_steps)
    return est.comm["dp"]


def test_each_method_costs_its_formula():
    config, n, b = get_config("small"), 4, 4
    alpha, beta = 50e-6, 1 / 0.1e9  # four ranks one per node: the inter-node link
    params = sum(p.size for p in GPT(config).parameters())
    ring = lambda nbytes: 2 * (n - 1) * (alpha + nbytes / n * beta)  # noqa: E731
    gather = lambda nbytes: (n - 1) * (alpha + nbytes / n * beta)  # noqa: E731
    assert dp_seconds("none") == pytest.approx(ring(params * b), rel=1e-12)
    hook = PowerSGD(rank=2)
    shapes = [s for s in stage_matrices(config, 1, 1, 0) if hook.matrix_shape(s)]
    plain = params - sum(m * k for m, k in shapes)
    expected = ring(plain * b) + ring(sum(2 * m for m, _ in shapes) * b) + ring(sum(2 * k for _, k in shapes) * b)
    assert dp_seconds("powersgd:2") == pytest.approx(expected, rel=1e-12)
    k = math.ceil(0.01 * params)
    assert dp_seconds("topk:0.01") == pytest.approx(gather(n * k * (b + 8)), rel=1e-12)
    assert dp_seconds("none", local_steps=8) == pytest.approx(ring(params * b) / 8, rel=1e-12)
    assert dp_seconds("sign") < dp_seconds("none") / 8
    assert np.isfinite(dp_seconds("powersgd:2", dp=1)) and dp_seconds("powersgd:2", dp=1) == 0


def test_a_matrix_at_the_powersgd_boundary_is_counted_uncompressed():
    ring = lambda n, nbytes, alpha, beta: nbytes  # noqa: E731  (bytes stand in for seconds)
    at_boundary, above = [(4, 4)], [(5, 4)]  # m·k = 2·(m + k)·r at r = 1; and 20 > 18
    seconds, how = dp_time(16, at_boundary, 2, 4, "powersgd:1", 1, 0.0, 1.0, ring, ring)
    assert seconds == 16 * 4 and "16 uncompressed + 0 P + 0 Q" in how
    seconds, how = dp_time(20, above, 2, 4, "powersgd:1", 1, 0.0, 1.0, ring, ring)
    assert seconds == (5 + 4) * 4 and "0 uncompressed + 5 P + 4 Q" in how
