"""Chapter 5: a column-parallel and a row-parallel linear make an MLP with one all-reduce.

    python tutorials/05_tensor_parallel/column_row_mlp.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/05_tensor_parallel/column_row_mlp.py

Prints: which rank holds which entries of each weight matrix, the largest difference
between the tensor-parallel MLP and the dense one (output, input gradient, weight
gradients), why gelu forbids splitting the first layer by rows, and the collectives
each rank ran, read from group.stats(), for Megatron's pairing and for a naive one.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor import nn
from minitensor.nn import functional as F
from parallel import ColumnParallelLinear, RowParallelLinear
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.tensor_parallel import full_grads

D_MODEL, HIDDEN = 4, 8          # small enough to draw; the MLP maps 4 -> 8 -> 4
BATCH, SEQ = 2, 3


def ownership(param, group):
    """The dense-shaped matrix of the tp rank holding each entry (collective)."""
    mine = np.full(param.shape, group.rank, dtype=np.int64)
    return group.all_gather(mine, axis=param.tp_axis)


def draw(name, owners, how):
    """A weight matrix as a grid of owner ranks, rows = out features, columns = in features."""
    out, inp = owners.shape
    lines = [f"{name} (out={out}, in={inp}), {how}: the digit is the rank holding the entry"]
    lines += ["    " + " ".join(str(r) for r in row) for row in owners]
    return "\n".join(lines)


def collectives(stats):
    """'all_reduce 1 call(s) 24 elements 192 bytes; ...' for one phase."""
    return "; ".join(f"{kind} {c['calls']} call(s) {c['elements']} elements {c['bytes']} bytes"
                     for kind, c in sorted(stats.items())) or "none"


def run_and_count(layers, x, group):
    """Forward and backward through `layers`; the collectives of each phase."""
    group.reset_stats()
    y = x
    for layer in layers:
        y = layer(y)
    forward = group.stats()
    group.reset_stats()
    (y * y).sum().backward()   # any scalar of y; (y*y) makes the upstream gradient non-trivial
    return y, forward, group.stats()


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    say(f"tensor parallel size tp = {group.size} ({group.backend} backend)")

    mt.manual_seed(0)                                   # same dense weights on every rank
    dense_fc = nn.Linear(D_MODEL, HIDDEN).double()
    dense_proj = nn.Linear(HIDDEN, D_MODEL).double()
    x_data = np.random.default_rng(1).standard_normal((BATCH, SEQ, D_MODEL))

    fc = ColumnParallelLinear(dense_fc, group)       # rows (output features) split
    proj = RowParallelLinear(dense_proj, group)      # columns (input features) split
    say("\n" + draw("fc.weight", ownership(fc.weight, group), "ColumnParallelLinear splits the rows"))
    say(draw("proj.weight", ownership(proj.weight, group), "RowParallelLinear splits the columns"))
    say(f"this rank holds fc.weight {fc.weight.shape}, fc.bias {fc.bias.shape}, "
        f"proj.weight {proj.weight.shape}, proj.bias {proj.bias.shape} (replicated)")

    # The dense MLP on one device, and the same MLP split over the tp group.
    x_ref = mt.Tensor(x_data.copy(), requires_grad=True)
    y_ref = dense_proj(F.gelu(dense_fc(x_ref), approximate="tanh"))
    (y_ref * y_ref).sum().backward()

    x = mt.Tensor(x_data.copy(), requires_grad=True)
    gelu = lambda h: F.gelu(h, approximate="tanh")  # noqa: E731  (GPT-2's GELU, as the GPT's MLP)
    y, forward, backward = run_and_count([fc, gelu, proj], x, group)
    grads = {**{f"fc.{k}": v for k, v in full_grads(fc, group).items()},
             **{f"proj.{k}": v for k, v in full_grads(proj, group).items()}}
    ref_grads = {"fc.weight": dense_fc.weight.grad, "fc.bias": dense_fc.bias.grad,
                 "proj.weight": dense_proj.weight.grad, "proj.bias": dense_proj.bias.grad}
    say("\nlargest difference vs one device (float64):")
    say(f"  output: {np.abs(y.data - y_ref.data).max():.1e}")
    say(f"  input gradient: {np.abs(x.grad - x_ref.grad).max():.1e}")
    say(f"  weight gradients: {max(np.abs(grads[k] - ref_grads[k]).max() for k in ref_grads):.1e}")

    # Why the first layer is split by rows of W (columns of x W^T): gelu is not additive.
    if group.rank == 0:
        w_parts = np.split(dense_fc.weight.data, group.size, axis=1)   # a row-parallel first layer
        x_parts = np.split(x_data, group.size, axis=-1)
        partial_sums = [xp @ wp.T for xp, wp in zip(x_parts, w_parts)]
        gelu_np = lambda z: F.gelu(mt.Tensor(z), approximate="tanh").data
        gap = np.abs(gelu_np(sum(partial_sums)) - sum(gelu_np(z) for z in partial_sums)).max()
        say(f"\nwith the first layer split by columns instead, gelu(sum of partial sums) "
            f"differs from the sum of gelus by: {gap:.2f}")

    say(f"\ncollectives on this rank, Megatron pairing (column -> gelu -> row), "
        f"activation {BATCH}x{SEQ}x{D_MODEL} = {BATCH * SEQ * D_MODEL} elements:")
    say(f"  forward:  {collectives(forward)}")
    say(f"  backward: {collectives(backward)}")

    # A naive pairing: both layers column-parallel, each gathering its output.
    naive_fc = ColumnParallelLinear(dense_fc, group, gather_output=True)
    naive_proj = ColumnParallelLinear(dense_proj, group, gather_output=True)
    y_naive, forward, backward = run_and_count([naive_fc, gelu, naive_proj],
                                               mt.Tensor(x_data.copy(), requires_grad=True), group)
    say("collectives on this rank, naive pairing (column+gather -> gelu -> column+gather):")
    say(f"  forward:  {collectives(forward)}")
    say(f"  backward: {collectives(backward)}")
    say(f"  naive output difference vs one device: {np.abs(y_naive.data - y_ref.data).max():.1e}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
