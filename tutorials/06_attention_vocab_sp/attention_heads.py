"""Chapter 6, part 1: attention split by heads (q, k, v column-parallel, proj row-parallel).

    python tutorials/06_attention_vocab_sp/attention_heads.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/06_attention_vocab_sp/attention_heads.py

Prints: which head and which rank every row of q/k/v and every column of proj belongs
to, the largest difference between ParallelSelfAttention and the dense SelfAttention
(output, input gradient, every weight gradient), the shape of the attention
probabilities a rank holds, and the collectives of one forward and one backward.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models.gpt import GPTConfig, SelfAttention
from parallel import ParallelSelfAttention
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.tensor_parallel import full_grads

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=4, d_model=8)
BATCH, SEQ = 2, 5


def collectives(stats):
    return "; ".join(f"{kind} {c['calls']} call(s) {c['elements']} elements"
                     for kind, c in sorted(stats.items())) or "none"


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    head_dim = CONFIG.d_model // CONFIG.n_head
    say(f"tp = {group.size}; d_model {CONFIG.d_model} = {CONFIG.n_head} heads x {head_dim}")

    mt.manual_seed(0)
    dense = SelfAttention(CONFIG).double()
    attn = ParallelSelfAttention(dense, group)

    rows = np.arange(CONFIG.d_model)
    owner = group.all_gather(np.full(attn.q.weight.shape[0], group.rank, dtype=np.int64))
    proj_owner = group.all_gather(np.full(attn.proj.weight.shape[1], group.rank, dtype=np.int64))
    say("\nq, k, v weight rows (output features) and proj weight columns (input features):")
    say("  row/column " + " ".join(f"{r:2d}" for r in rows))
    say("  head       " + " ".join(f"{r // head_dim:2d}" for r in rows))
    say("  q,k,v rank " + " ".join(f"{r:2d}" for r in owner))
    say("  proj rank  " + " ".join(f"{r:2d}" for r in proj_owner))
    say(f"every rank holds whole heads: local heads per rank = {attn.local_heads}")

    x_data = np.random.default_rng(1).standard_normal((BATCH, SEQ, CONFIG.d_model))
    x_ref = mt.Tensor(x_data.copy(), requires_grad=True)
    y_ref = dense(x_ref)
    (y_ref * y_ref).sum().backward()

    x = mt.Tensor(x_data.copy(), requires_grad=True)
    group.reset_stats()
    y = attn(x)
    forward = group.stats()
    group.reset_stats()
    (y * y).sum().backward()
    backward = group.stats()

    ref_grads = {name: p.grad for name, p in dense.named_parameters()}
    grads = full_grads(attn, group)
    say("\nlargest difference vs one device (float64):")
    say(f"  output: {np.abs(y.data - y_ref.data).max():.1e}")
    say(f"  input gradient: {np.abs(x.grad - x_ref.grad).max():.1e}")
    say(f"  weight gradients: {max(np.abs(grads[n] - ref_grads[n]).max() for n in ref_grads):.1e}")
    say(f"  parameters compared by dense name: {sorted(grads) == sorted(ref_grads)}")

    local_scores = (BATCH, attn.local_heads, SEQ, SEQ)
    say(f"\nattention probabilities on this rank: {local_scores} = {int(np.prod(local_scores))} "
        f"elements (dense: {BATCH * CONFIG.n_head * SEQ * SEQ})")
    say(f"collectives on this rank: forward {collectives(forward)}; backward {collectives(backward)}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
