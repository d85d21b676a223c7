"""Chapter 6, part 3: sequence parallelism — all-gather + reduce-scatter instead of all-reduce.

    python tutorials/06_attention_vocab_sp/sequence_parallel.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/06_attention_vocab_sp/sequence_parallel.py

One transformer block, three ways: on one device, tensor parallel, and tensor +
sequence parallel. Prints: the largest difference to one device (output, input
gradient, every parameter gradient), the collectives of one forward + backward with
their bytes (the same total with and without SP), the activation bytes a rank keeps
for backward (a bar per layout), and then a whole GPT trained one step with SP.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from minitensor.models.gpt import Block
from parallel import ParallelBlock, TensorParallelGPT
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.pipeline.memory import activation_bytes
from parallel.tensor_parallel import all_reduce_partial_grads, full_grads

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, d_model=16)
BATCH, SEQ = 2, 8


def run_block(block, x_data, group, sequence_parallel):
    """Forward + backward of `block` on this rank's part of x; (output, input grad, stats, kept bytes).

    Under SP the rank gets only its slice of the sequence and returns only its slice."""
    if sequence_parallel:
        x_data = np.split(x_data, group.size, axis=1)[group.rank]
    x = mt.Tensor(x_data.copy(), requires_grad=True)
    group.reset_stats()
    y = block(x)
    kept = activation_bytes(y)
    (y * y).sum().backward()     # under SP: this rank's share of the dense sum
    stats = group.stats()
    out, grad = y.data, x.grad
    if sequence_parallel:
        out, grad = (group.all_gather(a, axis=1) for a in (out, grad))
        all_reduce_partial_grads(block, group)   # LayerNorms and the row-parallel biases saw T/tp positions
    return out, grad, stats, kept


def describe(stats):
    return "; ".join(f"{kind} {c['calls']} calls {c['bytes']} bytes" for kind, c in sorted(stats.items()))


def bar(nbytes, largest, width=40):
    return "#" * max(1, round(width * nbytes / largest))


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    tp = group.size
    say(f"one block: batch {BATCH}, sequence {SEQ}, d_model {CONFIG.d_model}, tp = {tp}")

    x_data = np.random.default_rng(1).standard_normal((BATCH, SEQ, CONFIG.d_model))
    mt.manual_seed(0)
    dense = Block(CONFIG).double()
    x = mt.Tensor(x_data.copy(), requires_grad=True)
    y_ref = dense(x)
    dense_kept = activation_bytes(y_ref)
    (y_ref * y_ref).sum().backward()
    ref_grads = {name: p.grad for name, p in dense.named_parameters()}

    kept, volume = {"one device": dense_kept}, {}
    for sp in (False, True):
        label = f"tp={tp} + sequence parallel" if sp else f"tp={tp}"
        block = ParallelBlock(dense, group, sequence_parallel=sp)
        out, grad, stats, kept[label] = run_block(block, x_data, group, sp)
        grads = full_grads(block, group)
        say(f"\n{label}: largest difference vs one device (float64):")
        say(f"  output: {np.abs(out - y_ref.data).max():.1e}")
        say(f"  input gradient: {np.abs(grad - x.grad).max():.1e}")
        say(f"  parameter gradients: {max(np.abs(grads[n] - ref_grads[n]).max() for n in ref_grads):.1e}")
        say(f"  collectives (forward + backward): {describe(stats)}")
        volume[label] = sum(c["bytes"] for c in stats.values())
        say(f"  total bytes sent per rank: {volume[label]}")
    say(f"\nsame volume: bytes with SP / bytes without SP = "
        f"{volume[f'tp={tp} + sequence parallel'] / volume[f'tp={tp}']:.3f}")

    say("\nactivation bytes this rank keeps for backward (one block, float64):")
    for label, nbytes in kept.items():
        say(f"  {label:<28} {nbytes:>7} {bar(nbytes, dense_kept)}")
    say(f"  ratio tp+sp / tp: {kept[f'tp={tp} + sequence parallel'] / kept[f'tp={tp}']:.3f}")

    # The whole GPT: embedding reduce-scatters, head all-gathers, finish_grad_sync sums the partial grads.
    mt.manual_seed(0)
    gpt = GPT(CONFIG).double()
    rng = np.random.default_rng(2)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    model = TensorParallelGPT(gpt, group, sequence_parallel=True)
    _, loss = model(idx, targets)
    loss.backward()
    model.finish_grad_sync()
    grads = model.full_grads()
    _, ref_loss = gpt(idx, targets)
    ref_loss.backward()
    say(f"\nwhole GPT with tp={tp} + SP, one step: loss difference {abs(loss.item() - ref_loss.item()):.1e}, "
        f"largest gradient difference {max(np.abs(grads[n] - p.grad).max() for n, p in gpt.named_parameters()):.1e} "
        f"over {len(grads)} parameters")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
