"""Chapter 6, part 2: the vocabulary split over ranks — embedding and cross-entropy.

    python tutorials/06_attention_vocab_sp/vocab_parallel.py --threads 4
    mpiexec -n 4 python -m mpi4py tutorials/06_attention_vocab_sp/vocab_parallel.py

A vocabulary of 10 tokens over tp ranks: padded up to a multiple of tp with zero rows.
Prints: which rank holds which vocabulary row (and which rows are padding), the
largest difference between the vocab-parallel embedding / cross-entropy and the dense
ones, the gradient that reaches the padding columns, and how many numbers per token the
cross-entropy all-reduces compared with gathering the logits.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor import nn
from minitensor.nn import functional as F
from parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.tensor_parallel.sharding import gather, shard

VOCAB, D_MODEL = 10, 3
BATCH, SEQ = 2, 3


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, VOCAB, (BATCH, SEQ))
    targets = rng.integers(0, VOCAB, (BATCH, SEQ))
    targets[0, 0] = -100                                  # ignore_index: not counted in the mean

    mt.manual_seed(0)
    dense = nn.Embedding(VOCAB, D_MODEL).double()
    emb = VocabParallelEmbedding(dense, group)
    local_rows = emb.weight.shape[0]
    padded = local_rows * group.size
    owner = group.all_gather(np.full(local_rows, group.rank, dtype=np.int64))
    say(f"tp = {group.size}; vocabulary {VOCAB} padded to {padded} = {group.size} x {local_rows} rows")
    say("  token " + " ".join(f"{t:3d}" for t in range(padded)))
    say("  rank  " + " ".join(f"{r:3d}" for r in owner))
    if padded > VOCAB:
        say("        " + " ".join("pad" if t >= VOCAB else "   " for t in range(padded)))

    # Embedding: each rank looks up only its own rows; the all-reduce adds the pieces.
    ref = dense(idx)
    (ref * ref).sum().backward()
    group.reset_stats()
    out = emb(idx)
    (out * out).sum().backward()
    stats = group.stats()
    weight_grad = gather(emb.weight.grad, 0, (VOCAB, D_MODEL), group)
    say("\nlargest difference vs one device (float64):")
    say(f"  embedding output: {np.abs(out.data - ref.data).max():.1e}")
    say(f"  embedding weight gradient: {np.abs(weight_grad - dense.weight.grad).max():.1e}")
    say(f"  embedding collectives: all_reduce {stats['all_reduce']['calls']} forward + backward call(s)")

    # Cross-entropy from vocab-sharded logits: the logits themselves never travel.
    logits_full = rng.standard_normal((BATCH, SEQ, VOCAB))
    dense_logits = mt.Tensor(logits_full.copy(), requires_grad=True)
    dense_loss = F.cross_entropy(dense_logits, targets)
    dense_loss.backward()
    logits = mt.Tensor(shard(logits_full, 2, group, padded), requires_grad=True)
    group.reset_stats()
    loss = vocab_parallel_cross_entropy(logits, targets, group, vocab_size=VOCAB)
    loss.backward()
    stats = group.stats()["all_reduce"]
    grad = group.all_gather(logits.grad, axis=2)
    tokens = BATCH * SEQ
    say(f"  cross-entropy loss: {abs(loss.item() - dense_loss.item()):.1e}")
    say(f"  cross-entropy logit gradient: {np.abs(grad[..., :VOCAB] - dense_logits.grad).max():.1e}")
    if padded > VOCAB:
        say(f"  largest gradient on padding columns: {np.abs(grad[..., VOCAB:]).max():.1e}")
    say(f"\ncross-entropy over {tokens} tokens: all_reduce {stats['calls']} call(s), {stats['elements']} elements "
        f"= {stats['elements'] / tokens:g} numbers per token (max; sum of exp and target logit)")
    say(f"gathering the logits instead would move {tokens * padded} elements "
        f"= {padded} numbers per token (the padded vocabulary)")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=4)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
