"""mpiexec worker: a fixed matrix of pipeline layouts on real ranks, each equal to one device.

    mpiexec -n P python -m mpi4py pp_equivalence.py

Every rank runs the single-device reference itself and checks its gathered loss,
gradients and parameters against it (pp_common); rank r prints "rank r ok" at the end.
"""
import parallel
from minitensor.models.gpt import GPTConfig
from pp_common import check_against_single, expected_peaks, make_batches, run_pipeline, run_single

group = parallel.world()
p = group.size
cfg = GPTConfig(vocab_size=13, block_size=6, n_layer=2 * p, n_head=2, d_model=8)
cases = [  # (schedule, chunks, microbatches, recompute)
    ("gpipe", 1, 3, False), ("1f1b", 1, 2 * p, False), ("1f1b", 1, p + 1, True),
    ("interleaved", 2, 2 * p, False), ("interleaved", 2, p, True),
    ("zb-h1", 1, 2 * p, False), ("zb-h2", 1, 2 * p, False), ("zb-h1", 1, p + 1, True),
    ("dualpipev", 2, 2 * p, False), ("dualpipev", 2, 2 * p + 1, True),
]
for seed, (schedule, chunks, m, recompute) in enumerate(cases):
    batches = make_batches(seed, cfg, 2 * m, steps=2)
    history, peaks = run_pipeline(group, cfg, seed, batches, m, schedule, chunks, recompute=recompute)
    check_against_single(history, run_single(cfg, seed, batches))
    assert set(peaks) == {expected_peaks(schedule, p, m, chunks)[group.rank]}, (schedule, peaks)
print(f"rank {group.rank} ok", flush=True)
