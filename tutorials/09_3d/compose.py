"""Chapter 9, part 2: what each rank of a dp × tp × pp mesh holds, and what each group carries.

    python tutorials/09_3d/compose.py --threads 8
    mpiexec -n 8 python -m mpi4py tutorials/09_3d/compose.py [--dp 2 --tp 2 --pp 2]

Prints: one line per rank — coordinates, pipeline stage, its blocks, its parameter
count and the shapes of its shards of three weights (column-parallel `mlp.fc`,
row-parallel `attn.proj`, vocab-parallel `tok_emb` or `lm_head`) — and the parameters of
one replica next to the formula; then, after one training step, each group's counted
calls and elements on the first and the last pipeline stage next to their formulas,
and whether every rank's counts equal its formula.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT, GPTConfig
from parallel import Mesh
from parallel.hybrid import HybridGPT
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from parallel.comm.gather import all_gather_json

CONFIG = GPTConfig(vocab_size=32, block_size=8, n_layer=4, n_head=4, d_model=16)
BATCH, SEQ, M = 16, 8, 2       # global batch, sequence length, micro-batches per dp rank


def shard_shape(model, name):
    """(local shape, dense shape) of this rank's parameter `name` (replicated: the same twice)."""
    p = dict(model.named_parameters())[name]
    return p.shape, getattr(p, "full_shape", p.shape)


def holding(model):
    """What this rank's stage holds, in words."""
    stage = model.stages[0]
    blocks = stage.blocks.indices()
    parts = (["embeddings"] if stage.is_first else []) + [f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}"] + \
            (["ln_f + lm_head"] if stage.is_last else [])
    return stage.stage, blocks[0], " + ".join(parts)


def parameter_report(model, mesh, dense_count, say):
    world = mesh.world
    stage, first_block, parts = holding(model)
    held = dict(model.named_parameters())
    names = [f"blocks.{first_block}.mlp.fc.weight", f"blocks.{first_block}.attn.proj.weight"] + \
            [name for name in ("tok_emb.weight", "lm_head.weight") if name in held]
    shards = ", ".join("{} {} of {}".format(name, *shard_shape(model, name)) for name in names)
    line = (f"  rank {world.rank} (dp {mesh.dp_rank}, tp {mesh.tp_rank}, pp {mesh.pp_rank}) stage {stage}: "
            f"{parts}: {model.num_parameters():,} parameters; {shards}")
    for text in all_gather_json(world, line):
        say(text)
    # A replica is the tp × pp ranks of one dp index: the sharded parameters once, the replicated tp times.
    replicated = sum(p.size for p in model.parameters() if not hasattr(p, "tp_axis"))
    in_replica = mesh.dp_rank == 0
    replica_total, replicated_total = (int(v) for v in world.all_reduce(np.array(
        [model.num_parameters() * in_replica, replicated * (in_replica and mesh.tp_rank == 0)], dtype=np.int64)))
    say(f"\none replica (the {mesh.tp * mesh.pp} ranks of dp 0) holds {replica_total:,} parameters; "
        f"formula: dense {dense_count:,} + (tp-1) x replicated {replicated_total:,} = "
        f"{dense_count + (mesh.tp - 1) * replicated_total:,}")


def expected_counts(model, mesh):
    """{(group, kind): (calls, elements)} of one training step on this rank, from the layout alone.

    b·T·C is one micro-batch's activation (b = BATCH / (dp·m) rows), L this stage's blocks.
      tp: per micro-batch and block 4 all-reduces of b·T·C (attention and MLP: g forward, f
          backward); the first stage adds the vocab-parallel embedding's sum (forward); the
          last adds lm_head's f (backward) and the cross-entropy's two (b·T maxima; b·T sum-exps
          with b·T target logits).
      pp: per micro-batch one activation sent forward (unless last) and one gradient sent back
          (unless first), b·T·C each, and received likewise; the loss broadcast from the last
          stage (1 element) and the timeline's barrier.
      dp: the gradients once per step (one bucket holds all of them) and the loss (1 element).
    A group of one rank moves nothing and is left out (HybridGPT.communication_stats).
    """
    stage, b = model.stages[0], BATCH // (mesh.dp * M)
    blocks, act, tokens = len(stage.blocks.indices()), b * SEQ * CONFIG.d_model, b * SEQ
    first, last = int(stage.is_first), int(stage.is_last)
    p2p = (M * (2 - first - last), M * (2 - first - last) * act)
    counts = {("tp", "all_reduce"): (M * (4 * blocks + first + 3 * last),
                                     M * ((4 * blocks + first + last) * act + 3 * tokens * last)),
              ("pp", "send"): p2p, ("pp", "recv"): p2p, ("pp", "broadcast"): (1, 1), ("pp", "barrier"): (1, 0),
              ("dp", "all_reduce"): (2, model.num_parameters() + 1)}
    sizes = mesh.sizes()
    return {key: value for key, value in counts.items() if value[0] and sizes[key[0]] > 1}


def main(dp, tp, pp):
    world = parallel.world()
    say = print if world.rank == 0 else (lambda *args: None)
    mt.manual_seed(0)
    gpt = GPT(CONFIG, dtype=np.float64)
    dense_count = sum(p.size for p in gpt.parameters())
    mesh = Mesh(dp, tp, pp)
    model = HybridGPT(gpt, mesh, microbatches=M, schedule="1f1b")
    model.configure_optimizer()
    say(f"GPT n_layer={CONFIG.n_layer} n_head={CONFIG.n_head} d_model={CONFIG.d_model} "
        f"vocab={CONFIG.vocab_size}: {dense_count:,} parameters on one device; mesh dp={dp} tp={tp} pp={pp}")
    say("\nwhat each rank holds:")
    parameter_report(model, mesh, dense_count, say)

    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)) for _ in range(2))
    model.reset_communication_stats()   # the start-up broadcast over dp is not part of a step
    model.train_step(idx, targets)
    model.optimizer_step()
    counted = {key: (c["calls"], c["elements"], c["bytes"]) for key, c in model.communication_stats().items()}
    expected = expected_counts(model, mesh)
    matches = sorted(counted) == sorted(expected) and all(counted[k][:2] == expected[k] for k in expected)

    b = BATCH // (dp * M)
    say(f"\none step: global batch {BATCH} x {SEQ}, m = {M} micro-batches of b = {b} row(s) per dp rank, "
        f"C = {CONFIG.d_model}; activation b*T*C = {b * SEQ * CONFIG.d_model} elements")
    first_rank, last_rank = mesh.rank_of(0, 0, 0), mesh.rank_of(0, 0, pp - 1)
    for shown in sorted({first_rank, last_rank}):
        lines = [f"rank {world.rank} (stage {model.stages[0].stage}, L = {len(model.stages[0].blocks.indices())} blocks,"
                 f" {model.num_parameters():,} parameters), counted | formula:"]
        for key in sorted(expected):
            calls, elements, nbytes = counted.get(key, (0, 0, 0))
            lines.append(f"  {key[0]} {key[1]:<11} counted {calls:>3} calls {elements:>6} elements {nbytes:>7} bytes"
                         f" | formula {expected[key][0]:>3} calls {expected[key][1]:>6} elements")
        text = "\n".join(lines) if world.rank == shown else ""
        say(all_gather_json(world, text)[shown])
    agree = world.all_reduce(np.array([int(matches)], dtype=np.int64))[0]
    say(f"\nranks whose counts equal the formula: {int(agree)} of {world.size}")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=8)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main, args.dp, args.tp, args.pp)
