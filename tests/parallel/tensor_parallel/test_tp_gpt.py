"""A tensor-parallel GPT equals the single-device GPT: forward, loss, every gradient and
several AdamW steps, for drawn shapes, tp sizes (heads divisible, vocabulary often not),
sequence parallelism on and off, over the threads backend."""
from hypothesis import given
from strategies import seeds, tp_gpt_layouts
from tp_common import check_against_dense, check_replicas_identical, make_batches, run_dense, run_tensor_parallel

import parallel

STEPS = 3


@given(layout=tp_gpt_layouts(), seed=seeds)
def test_TensorParallelGPT_trains_like_one_device(layout, seed):
    config, sp = layout["config"], layout["sequence_parallel"]
    batches = make_batches(config, layout["batch"], layout["seq"], STEPS, seed)
    dense = run_dense(config, seed, batches)
    runs = parallel.run_threads(
        layout["tp"], lambda: run_tensor_parallel(config, seed, batches, parallel.world(), sp), timeout=60)
    for run in runs:
        check_against_dense(run, dense)
    check_replicas_identical([replicated for _, _, replicated in runs])
