"""Chapter 17, part 1: BERT's masking rule, and a BERT through the GPT's parallel layers.

    python tutorials/17_smaller_models/bert_masking.py --threads 8
    mpiexec -n 8 python -m mpi4py tutorials/17_smaller_models/bert_masking.py

Prints: a few masked addition problems with their labels; the shares of [MASK], random
and unchanged tokens among 60,000 chosen ones (80/10/10); whether every rank drew the
same masks from (seed, step); then one training step of a BERT on a dp=2 × tp=2 × pp=2
mesh next to the same step on one device (float64): the loss difference, the largest
relative gradient difference, and the tied embedding's gradient (its lookup on the first
stage plus its MLM head on the last, summed over the embedding group) next to one device's.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.data.masked_addition import MASK, SEP, MaskedAdditionTask
from minitensor.data.mlm import IGNORE_INDEX
from minitensor.models import BERT, BertConfig
from parallel import Mesh
from parallel.hybrid import HybridGPT
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments

SEED, STEP, BATCH = 0, 1, 16


def show_masking(task, say):
    inputs, labels = task.get_batch(4, generator=np.random.default_rng([SEED, STEP]))
    say("masked problems (one of 7 digits chosen per row: 15% rounded; '_' is [MASK]):")
    for row, label in zip(inputs, labels):
        where = int(np.flatnonzero(label != IGNORE_INDEX)[0])
        say(f"  input {task.decode(row)}   label at position {where}: {task.vocab[label[where]]}")
    inputs, labels = task.get_batch(60_000, generator=np.random.default_rng([SEED, 10**6]))
    chosen, original = labels != IGNORE_INDEX, np.where(labels == IGNORE_INDEX, 0, labels)
    shown = inputs[chosen]
    masked = (shown == MASK).mean()
    unchanged = (shown == original[chosen]).mean()
    say(f"of {chosen.sum():,} chosen tokens: [MASK] {masked:.3f}, random {1 - masked - unchanged:.3f}, "
        f"unchanged {unchanged:.3f} (a random digit can equal the original: 1 in 10 of the 10%)")


def main(dp, tp, pp):
    world = parallel.world()
    say = print if world.rank == 0 else (lambda *args: None)
    task = MaskedAdditionTask(digits=2, seed=SEED)
    show_masking(task, say)

    idx, labels = task.get_batch(BATCH, generator=np.random.default_rng([SEED, STEP]))  # every rank: the same
    agree = world.all_gather(np.concatenate([idx, labels]).astype(np.int64)[None])
    say(f"ranks that drew the same masks from (seed, step): {int((agree == agree[0]).all(axis=(1, 2)).sum())} "
        f"of {world.size}")

    config = BertConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=2, n_head=4, d_model=16,
                        sep_id=SEP)
    mt.manual_seed(0)
    model = HybridGPT(BERT(config, dtype=np.float64), Mesh(dp, tp, pp), microbatches=2)
    loss = model.train_step(idx, labels)
    grads = model.full_grads()
    mt.manual_seed(0)
    dense = BERT(config, dtype=np.float64)
    _, ref_loss = dense(idx, labels)
    ref_loss.backward()
    worst = max(float(np.abs(grads[n] - p.grad).max() / np.abs(p.grad).max()) for n, p in dense.named_parameters()
                if np.abs(p.grad).max() > 1e-6)  # (attention's key bias: zero in exact arithmetic, only noise)
    tied = grads["tok_emb.weight"]
    say(f"\nBERT {config.n_layer} blocks, d_model {config.d_model}, on dp={dp} tp={tp} pp={pp}, one step:")
    say(f"loss {loss:.12f}, relative loss difference to one device: {abs(loss - ref_loss.item()) / ref_loss.item():.1e}")
    say(f"largest relative gradient difference to one device: {worst:.1e}")
    say(f"tied embedding gradient, largest difference to one device: "
        f"{np.abs(tied - dense.tok_emb.weight.grad).max():.1e}")
    stats = model.communication_stats().get(("embedding", "all_reduce"))
    say(f"embedding group on rank 0: {stats['calls']} all-reduce of {stats['elements']} elements "
        f"(the (padded vocabulary / tp) x d_model shard)" if stats else "embedding group: none (pp = 1)")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=8)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main, args.dp, args.tp, args.pp)
