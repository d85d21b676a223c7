"""HybridGPT with context parallelism (the 4D mesh) on the threads backend: every layout
equals one device (loss, every gradient, parameters after 3 AdamW steps), the clear errors,
the counted work and traffic of a training step, and checkpoints that reshard across cp."""
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import context_parallel_layouts, seeds

from minitensor.models.gpt import GPTConfig
from minitensor.nn.attention_kernels import FlashAttention
from parallel import HybridGPT, Mesh, run_threads
from parallel.checkpoint import load_checkpoint, save_checkpoint
from parallel.context_parallel import attention_work, ring_elements

sys.path.insert(0, str(Path(__file__).parents[1] / "mpi_scripts"))
from ckpt_common import hybrid, train, train_dense  # noqa: E402
from hybrid_common import check_against_single, make_batches, make_model, run_hybrid, run_single  # noqa: E402

STEPS = 3


def check_layout(layout, config, micro_batch, seq, seed):
    batches = make_batches(seed, config, layout["dp"] * layout["microbatches"] * micro_batch, seq, STEPS)
    world = layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"]
    histories = run_threads(world, run_hybrid, layout, config, seed, batches, 1, timeout=120)
    reference = run_single(config, seed, batches, 1)
    for history in histories:
        check_against_single(history, reference)


@settings(max_examples=15)  # each example trains up to 8 threads for 3 steps
@given(drawn=context_parallel_layouts(), seed=seeds)
def test_any_4d_layout_equals_one_device_loss_gradients_and_adamw_steps(drawn, seed):
    check_layout(drawn["layout"], GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"], seed)


def layout(dp=1, tp=1, pp=1, cp=2, cp_layout="zigzag", microbatches=1, sequence_parallel=False, zero=False):
    return dict(dp=dp, tp=tp, pp=pp, cp=cp, cp_layout=cp_layout, microbatches=microbatches, schedule="1f1b",
                chunks=1, sequence_parallel=sequence_parallel, recompute_activations=False, zero=zero)


@pytest.mark.parametrize("spec", [
    layout(cp=4, cp_layout="contiguous"),
    layout(tp=2, cp=2, sequence_parallel=True, microbatches=2),
    layout(dp=2, tp=2, cp=2, zero=True),
    dict(layout(tp=2, cp=2, sequence_parallel=True), cp_comm_type="a2a"),
], ids=["cp4-contiguous", "cp2-tp2-sp", "cp2-tp2-dp2-zero", "ulysses-cp2-tp2-sp"])
def test_fixed_4d_layouts_equal_one_device(spec):
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4 * spec["tp"], d_model=8 * spec["tp"])
    check_layout(spec, config, micro_batch=1, seq=8, seed=7)


@pytest.mark.parametrize("cp, tp, sp, cp_layout, seq, message", [
    (2, 1, False, "zigzag", 6, "sequence length 6 is not divisible by 2·cp = 4"),
    (4, 1, False, "zigzag", 12, "sequence length 12 is not divisible by 2·cp = 8"),
    (3, 1, False, "contiguous", 8, "sequence length 8 is not divisible by cp = 3"),
    (2, 2, True, "contiguous", 6, "sequence length 6 / cp=2 = 3 divisible by tp=2"),
])
def test_a_sequence_the_layout_cannot_cut_is_an_error_on_every_rank(cp, tp, sp, cp_layout, seq, message):
    config = GPTConfig(vocab_size=7, block_size=16, n_layer=1, n_head=2, d_model=4)
    idx = np.zeros((2, seq), dtype=np.int64)

    def body():
        model = HybridGPT(make_model(config, 0), Mesh(1, tp, 1, cp), sequence_parallel=sp, cp_layout=cp_layout)
        with pytest.raises(ValueError) as info:
            model.train_step(idx, idx)
        return str(info.value)
    errors = run_threads(cp * tp, body, timeout=30)
    assert all(message in e for e in errors), errors


def test_attention_dropout_under_context_parallelism_is_an_error():
    config = GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, d_model=4, dropout=0.1)
    with pytest.raises(ValueError, match=r"attention dropout 0.1 under context parallelism \(cp=2\)"):
        run_threads(2, lambda: HybridGPT(make_model(config, 0), Mesh(cp=2)), timeout=30)


@pytest.mark.parametrize("cp_layout", ["zigzag", "contiguous"])
def test_a_training_step_counts_the_formulas_work_and_ring_traffic(cp_layout):
    cp, tp, m, micro, seq = 2, 2, 2, 1, 8
    config = GPTConfig(vocab_size=11, block_size=seq, n_layer=2, n_head=4, d_model=16)
    idx, targets = make_batches(0, config, m * micro, seq, 1)[0]

    def one_step():
        model = HybridGPT(make_model(config, 0), Mesh(tp=tp, cp=cp), microbatches=m, cp_layout=cp_layout)
        model.reset_communication_stats()
        model.train_step(idx, targets)
        return model.mesh.cp_rank, model.context.work, model.communication_stats()

    heads, hidden = config.n_head // tp, config.d_model // tp
    for cp_rank, work, stats in run_threads(cp * tp, one_step, timeout=30):
        calls = config.n_layer * m  # attention layers x micro-batches
        assert work == calls * micro * heads * attention_work(seq, cp_rank, cp, cp_layout)
        per_call = ring_elements(micro, seq, hidden, cp)
        elements = calls * (per_call["forward"] + per_call["backward"])
        assert stats[("cp", "send")] == {"calls": calls * (4 * (cp - 1) + 2 * cp), "elements": elements,
                                         "bytes": 8 * elements}
        assert stats[("cp", "recv")] == stats[("cp", "send")]


def test_checkpoints_reshard_across_cp(tmp_path):
    # ckpt_common's CONFIG: block 8, 4 heads. Save under dp2 x cp2 (ZeRO: moment ranges over
    # dp x cp), resume under cp4 and under one process; losses continue the uninterrupted run's.
    steps = 4
    uninterrupted = train_dense(steps)

    def save():
        model = hybrid(2, 1, 1, zero=True, cp=2)
        losses = train(model, range(2))
        save_checkpoint(tmp_path, model, step=2)
        return losses
    first = run_threads(4, save, timeout=60)[0]

    def resume(cp, tp):
        def body():
            model = hybrid(1, tp, 1, cp=cp, cp_layout="contiguous")
            meta = load_checkpoint(tmp_path, model)
            return train(model, range(meta["step"], steps)), meta["resharded"]
        return run_threads(cp * tp, body, timeout=60)[0]

    for cp, tp in ((4, 1), (1, 1), (2, 2)):
        second, resharded = resume(cp, tp)
        assert resharded
        assert_close(first + second, uninterrupted, f"losses resumed under cp={cp} tp={tp}")


@pytest.mark.parametrize("cp_layout", ["zigzag", "contiguous"])
def test_ignored_targets_still_give_the_mean_over_every_counted_token(cp_layout):
    # The addition task ignores the prompt: the first cp ranks count fewer tokens than the
    # last, so the mean of the ranks' means would not be the loss; loss_weight corrects it.
    # (Every row ignores as many: dp and micro-batches average equal-count means, as before cp.)
    spec = layout(cp=4, cp_layout=cp_layout, microbatches=2, dp=2)
    config = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, d_model=8)
    batches = make_batches(3, config, 4, 16, STEPS)
    for _, targets in batches:
        targets[:, :5] = -100
        targets[:, 9] = -100
    histories = run_threads(8, run_hybrid, spec, config, 3, batches, 1, timeout=120)
    reference = run_single(config, 3, batches, 1)
    for history in histories:
        check_against_single(history, reference)


@settings(max_examples=6)  # each example trains up to 8 threads for 3 steps
@given(drawn=context_parallel_layouts(), seed=seeds, block=st.integers(1, 5))
def test_flash_attention_in_any_4d_layout_equals_the_dense_one_device_model(drawn, seed, block):
    """The tiled kernel on the rank's heads (tp), its stage's blocks (pp), each ring block pair or
    Ulysses' heads (cp), in tiles that rarely divide a chunk: loss, gradients and AdamW steps
    equal the dense attention on one device."""
    layout = dict(drawn["layout"], attention=FlashAttention(block, block + 1))
    check_layout(layout, GPTConfig(**drawn["config"]), drawn["micro_batch"], drawn["seq"], seed)
