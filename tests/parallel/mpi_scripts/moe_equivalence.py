"""Under mpiexec: Group.all_to_all with uneven splits on real ranks, then the MoE GPT under
HybridGPT(Mesh(dp, tp, pp, ep=ep), zero=zero) (argv: dp tp pp ep zero) against one device, dropless and with
capacity. Prints "rank R ok" and the worst difference."""
import sys

import numpy as np
from moe_common import batches, expert_parallel, moe_config, single_device, worst_difference

import parallel

world = parallel.world()
n, rank = world.size, world.rank
# rank r sends (r + s) % 3 rows to rank s, each row [r, s, j]
send = [(rank + s) % 3 for s in range(n)]
rows = np.array([[rank, s, j] for s in range(n) for j in range(send[s])], dtype=np.float64).reshape(-1, 3)
got = world.all_to_all(rows, send, [(s + rank) % 3 for s in range(n)])
expected = [[s, rank, j] for s in range(n) for j in range((s + rank) % 3)]
assert got.tolist() == expected, (got, expected)
assert world.stats()["all_to_all"]["bytes"] == (rows.shape[0] - send[rank]) * 3 * 8

dp, tp, pp, ep, zero = map(int, sys.argv[1:6])
worst = 0.0
for capacity in (None, 1.0):
    config = moe_config(n_experts=2 * ep, top_k=2, capacity_factor=capacity)
    data = batches(3, batch=4 * dp)
    parallel_run = expert_parallel(config, data, world, dp, ep, microbatches=2, tp=tp, pp=pp, zero=zero)
    worst = max(worst, worst_difference(single_device(config, data), parallel_run))
assert worst < 1e-9, worst
print(f"rank {rank} ok, worst {worst:.1e}", flush=True)
