"""Which model stage each (rank, chunk) of a pipeline holds: the *placement*.

p ranks, v chunks per rank:
    "loop"    chunk c of rank r is stage c·p + r of p·v (Megatron's interleaving: with p = 2,
              v = 2 rank 0 holds stages 0 and 2, rank 1 holds stages 1 and 3);
    "v"       v = 2, rank r holds stages r and 2p-1-r of 2p (DualPipeV, dualpipe.py): the stages
              run down the ranks and back up, the last stage sits on rank 0 and stages p-1 and p
              meet on rank p-1, which hands over locally (no message);
    "mirror"  v = 2, p stages, each held TWICE (DualPipe, dualpipe.py): chunk 0 of rank r is stage
              r of the pipeline running down the ranks, chunk 1 is stage p-1-r of its mirror image
              running up. A micro-batch goes one way only, so the chunk is its direction: the first
              half of the m micro-batches goes down (chunk 0), the second half up (chunk 1).
Under "loop" and "v" every chunk sees every micro-batch and a stage's neighbour is found from
the stage alone; under "mirror" it also takes the direction (the chunk, which a message keeps).
"""

PLACEMENTS = ("loop", "v", "mirror")


def num_stages(p, v, placement="loop"):
    """How many model stages the pipeline holds: p·v, except the mirror's p (each twice)."""
    return p if placement == "mirror" else p * v


def stage_of(rank, chunk, p, placement="loop"):
    """Model stage held by `chunk` of `rank`."""
    if placement in ("v", "mirror"):
        return rank if chunk == 0 else (2 * p if placement == "v" else p) - 1 - rank
    return chunk * p + rank


def rank_and_chunk(stage, p, placement="loop", chunk=0):
    """Inverse of `stage_of`: (rank, chunk) holding `stage`; under "mirror" in the direction `chunk`."""
    if placement == "mirror":
        return (stage, 0) if chunk == 0 else (p - 1 - stage, 1)
    if placement == "v":
        return (stage, 0) if stage < p else (2 * p - 1 - stage, 1)
    return stage % p, stage // p


def microbatches_of(chunk, m, placement="loop"):
    """The micro-batches `chunk` runs: all m, except under "mirror" its direction's half."""
    if placement == "mirror":
        return range(0, m // 2) if chunk == 0 else range(m // 2, m)
    return range(m)
