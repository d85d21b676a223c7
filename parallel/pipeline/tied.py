"""Parameters two pipeline stages hold, whose two copies are ONE parameter of the model.

BERT's token embedding: the first stage looks tokens up in it and the last stage's MLM head
multiplies with it (tied weights). Each of the two stages holds its own copy (on other ranks
there is nothing to share), made from the same dense weight. The loss depends on the one
tied parameter through both uses, so its gradient is the SUM of the two copies' gradients:

    dL/dE = dL/dE|embedding + dL/dE|head

After backward the two copies' gradients are all-reduced over the "embedding group", the
first and the last pp rank of each (dp, tp, cp) cell (Megatron-LM's embedding group); both
then hold the full gradient, take the same optimizer step and stay equal.

DualPipe (dualpipe.py, placement "mirror") holds EVERY stage twice: stage k on pp rank k for
the micro-batches going down the ranks, and on pp rank pp-1-k for those going up. Each copy
sees half of the micro-batches, the loss is their sum, so again

    dL/dθ_k = dL/dθ_k|down + dL/dθ_k|up,

the same all-reduce of the copies' gradients over the pair of pp ranks k and pp-1-k of the
cell (the embedding group is the pair 0 and pp-1): `MirroredGradients`.
"""
from ..data_parallel.reducer import Reducer


def pair_group(mesh, paired):
    """The group of pp ranks r and pp-1-r of this rank's (dp, tp, cp) cell when `paired` (a
    collective over the world: every rank calls it; an unpaired rank gets a group of its own,
    never used)."""
    cell = (mesh.dp_rank * mesh.tp + mesh.tp_rank) * mesh.cp + mesh.cp_rank
    pair = min(mesh.pp_rank, mesh.pp - 1 - mesh.pp_rank)
    color = cell * mesh.pp + pair if paired else mesh.dp * mesh.tp * mesh.cp * mesh.pp + mesh.world.rank
    return mesh.world.split(color=color, key=mesh.pp_rank)


def embedding_group(mesh):
    """The pp ranks 0 and pp-1 of this rank's cell (a collective over the world)."""
    return pair_group(mesh, mesh.pp_rank in (0, mesh.pp - 1))


class TiedGradients:
    """Sum the tied copies' gradients across the first and last stage of `stages` (this rank's).
    `ties`: whether the model ties parameters across its ends (the same on every rank).
    `left_out`: the names whose values the other copy gives to the single-device view."""

    name = "embedding"  # the group's name in the layout's communication counts

    def __init__(self, stages, mesh, ties):
        self.copies = [p for stage in stages for name, p in stage.named_parameters() if name in stage.tied_names()]
        # With pp = 1 one stage is both ends (the pipeline allows no chunks on one rank): nothing to sum.
        self.group = embedding_group(mesh) if ties and mesh.pp > 1 else None
        self.left_out = {name for stage in stages if not stage.is_first for name in stage.tied_names()}

    def finish(self):
        """After backward, before the optimizer (and in the same order on every rank)."""
        if self.copies:
            Reducer(self.copies, self.group, divisor=1).finish()


class MirroredGradients(TiedGradients):
    """DualPipe: sum each stage's two copies' gradients over the pair of pp ranks r and pp-1-r.
    Both ranks hold stages r and pp-1-r (as chunks 0 and 1 on one, 1 and 0 on the other): listed
    by stage, their parameters line up one to one. The single-device view takes chunk 0's."""

    name = "mirror"

    def __init__(self, stages, mesh):
        # exercise 22.2: which gradients DualPipe sums, and where
        # hint: every parameter of this rank's stages is a copy; list them in the same order on both ranks of
        # hint: the pair (by model stage: stage.stage), and sum over the pair's group, pair_group(mesh, paired=True)
        self.copies = [p for stage in sorted(stages, key=lambda s: s.stage) for p in stage.parameters()]
        self.group = pair_group(mesh, paired=True)
        # end exercise
        self.left_out = {name for name, _ in stages[1].named_parameters()}


def copies_to_sum(stages, mesh, ties, placement, model_name):
    """The parameters held twice whose gradients are summed, by the pipeline's placement: every
    stage's two copies under DualPipe's "mirror", else the tied ends (if the model ties any)."""
    if placement != "mirror":
        return TiedGradients(stages, mesh, ties)
    if ties:
        raise ValueError(f"schedule 'dualpipe' with {model_name}: pp rank 0 would hold both ends, where the "
                         "tied embedding's two uses are one parameter, not two copies to sum; use 1f1b")
    return MirroredGradients(stages, mesh)
