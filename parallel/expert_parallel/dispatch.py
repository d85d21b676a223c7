"""Expert parallelism over an ep group of n ranks (GShard, DeepSpeed-MoE, Megatron-Core):
rank r holds experts [r·E/n, (r+1)·E/n) and keeps its own tokens. In one MoE layer:

    route           this rank's tokens, as on one device (minitensor.nn.moe): the kept
                    assignments sorted by expert, x_perm, counts (E,) rows per expert
    counts          one small all-to-all: received[s, j] = rows rank s sends for my expert j
    dispatch        all-to-all of x_perm: the rows for rank r's experts (contiguous, since
                    x_perm is sorted by expert) go to rank r; they arrive by source, then expert
    regroup         reorder them by expert, then source (expert_major_order)
    experts         each local expert on its rows
    combine         the inverse reorder, then the all-to-all back: every row returns to its
                    token's rank, in x_perm's order; unpermute and weight as on one device

Backward mirrors it: AllToAll's backward is the all-to-all with the splits swapped, and a
gather's backward is the scatter of its rows (minitensor.nn.moe_ops). An expert's gradient
on rank r sums what every rank of the ep group sent it; its replicas (the edp group, the
ranks of the other ep groups at r's place) hold the rest of the batch's (hybrid/sections.py).
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.nn.module import Module, ModuleList
from minitensor.nn.moe import MoE
from minitensor.nn.moe_ops import gather_rows


class AllToAll(Function):
    """Rows of x to the ranks of `group` (send[r] to rank r), recv[s] rows from rank s. The
    gradient of a row goes back where the row came from: the same exchange, splits swapped."""

    def forward(self, x, group, send, recv):
        self.group, self.send, self.recv = group, send, recv
        return group.all_to_all(x, send, recv)

    def backward(self, grad):
        return self.group.all_to_all(np.ascontiguousarray(grad), self.recv, self.send)


def all_to_all(x, group, send, recv):
    """Differentiable Group.all_to_all of the rows of Tensor x."""
    return AllToAll.apply(x, group=group, send=[int(n) for n in send], recv=[int(n) for n in recv])


def expert_major_order(received):
    """Rows that arrived grouped by (source s, expert j), received[s, j] each, as the row order
    grouped by (expert j, source s): each local expert's rows side by side."""
    sizes = received.reshape(-1)
    starts = (np.cumsum(sizes) - sizes).reshape(received.shape)
    ep, local = received.shape
    return np.concatenate([np.arange(starts[s, j], starts[s, j] + received[s, j])
                           for j in range(local) for s in range(ep)]).astype(np.int64)


def inverse(order):
    undo = np.empty_like(order)
    undo[order] = np.arange(order.size)
    return undo


class ExpertParallelMoE(MoE):
    """`moe` with only this rank's experts of the ep `group` (under their single-device names,
    `experts.{global index}`); the router and the settings are moe's own. After each forward,
    `sent` and `received`: the rows this rank sent to and received from each rank."""

    def __init__(self, moe, group):
        Module.__init__(self)
        if moe.n_experts % group.size:
            raise ValueError(f"n_experts={moe.n_experts} is not divisible by ep={group.size}")
        for name, value in vars(moe).items():  # router, experts, drop and the settings, in moe's order
            if name not in ("_parameters", "_modules", "training"):
                setattr(self, name, value)
        self.training, self.group = moe.training, group
        self.n_local = moe.n_experts // group.size
        first = group.rank * self.n_local
        local = ModuleList()
        for index in range(first, first + self.n_local):
            setattr(local, str(index), moe.experts[index])
        self.experts = local

    def run_experts(self, x_perm, counts):
        """x_perm: this rank's rows sorted by expert (counts[e] for expert e); returns the experts'
        outputs in the same order, each computed on the rank that holds its expert."""
        per_rank = counts.reshape(self.group.size, self.n_local).astype(np.int64)
        received = self.group.all_to_all(per_rank)  # row s: what rank s sends for each of my experts
        send, recv = per_rank.sum(axis=1), received.sum(axis=1)
        self.sent, self.received = send, recv  # rows to and from each rank of the last forward (for the pictures)
        arrived = all_to_all(x_perm, self.group, send, recv)  # dispatch
        order = expert_major_order(received)
        y_local = super().run_experts(gather_rows(arrived, order), received.sum(axis=0))
        return all_to_all(gather_rows(y_local, inverse(order)), self.group, recv, send)  # combine


def shard_experts(gpt, group):
    """Every MoE block of `gpt` keeps only this rank's experts of the ep `group`, in place."""
    for block in gpt.blocks:
        if isinstance(block.mlp, MoE):
            block.mlp = ExpertParallelMoE(block.mlp, group)
    return gpt
