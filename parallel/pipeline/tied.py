"""Parameters both ends of the pipeline hold: BERT's token embedding, which the first stage
looks tokens up in and the last stage's MLM head multiplies with (tied weights).

Each of the two stages holds its own copy (on other ranks there is nothing to share),
made from the same dense weight. The loss depends on the one tied parameter through
both uses, so its gradient is the SUM of the two copies' gradients:

    dL/dE = dL/dE|embedding + dL/dE|head

After backward the two copies' gradients are all-reduced over the "embedding group", the
first and the last pp rank of each (dp, tp, cp) cell (Megatron-LM's embedding group); both
then hold the full gradient, take the same optimizer step and stay equal.
"""
from ..data_parallel.reducer import Reducer


def embedding_group(mesh):
    """The group of pp ranks 0 and pp-1 of this rank's (dp, tp, cp) cell (a collective over the
    world: every rank calls it; a middle stage gets a group of its own, never used)."""
    at_an_end = mesh.pp_rank in (0, mesh.pp - 1)
    cell = (mesh.dp_rank * mesh.tp + mesh.tp_rank) * mesh.cp + mesh.cp_rank
    color = cell if at_an_end else mesh.dp * mesh.tp * mesh.cp + mesh.world.rank
    return mesh.world.split(color=color, key=mesh.pp_rank)


class TiedGradients:
    """Sum the tied copies' gradients across the first and last stage of `stages` (this rank's).
    `ties`: whether the model ties parameters across its ends (the same on every rank)."""

    def __init__(self, stages, mesh, ties):
        self.copies = [p for stage in stages for name, p in stage.named_parameters() if name in stage.tied_names()]
        # With pp = 1 one stage is both ends (the pipeline allows no chunks on one rank): nothing to sum.
        self.group = embedding_group(mesh) if ties and mesh.pp > 1 else None

    def finish(self):
        """After backward, before the optimizer (and in the same order on every rank)."""
        if self.copies:
            Reducer(self.copies, self.group, divisor=1).finish()
