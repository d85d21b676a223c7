"""Expert parallelism over an ep group of n ranks (GShard, DeepSpeed-MoE, Megatron-Core):
rank r holds experts [r·E/n, (r+1)·E/n) and keeps its own tokens. The MoE layer stays
itself: `shard_experts` leaves it only this rank's experts and gives it an AllToAllDispatcher
in place of its local one, which takes the rows to their experts' ranks and back. In one
MoE layer:

    route           this rank's tokens, as on one device (minitensor.nn.moe): the kept
                    assignments sorted by expert, x_perm, counts (E,) rows per expert
    counts          one small all-to-all: received[s, j] = rows rank s sends for my expert j
    dispatch        all-to-all of x_perm: the rows for rank r's experts (contiguous, since
                    x_perm is sorted by expert) go to rank r; they arrive by source, then expert
    regroup         reorder them by expert, then source (expert_major_order)
    experts         each local expert on its rows (the layer holds only these)
    combine         the inverse reorder, then the all-to-all back: every row returns to its
                    token's rank, in x_perm's order; unpermute and weight as on one device

Backward mirrors it: AllToAll's backward is the all-to-all with the splits swapped, and a
gather's backward is the scatter of its rows (minitensor.nn.moe_ops). An expert's gradient
on rank r sums what every rank of the ep group sent it; its replicas (the edp group, the
ranks of the other ep groups at r's place) hold the rest of the batch's (hybrid/sections.py).
"""
import numpy as np

from minitensor.autograd import Function
from minitensor.nn.module import ModuleList
from minitensor.nn.moe import MoE, run_each_expert
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


class AllToAllDispatcher:
    """The MoE layer's dispatcher (minitensor.nn.moe.LocalDispatcher's interface) when its
    experts are spread over the ep `group`: the layer holds only this rank's. After each
    forward, `sent` and `received`: the rows this rank sent to and received from each rank."""

    def __init__(self, group):
        self.group = group
        self.sent = self.received = None

    def run_experts(self, x_perm, counts, experts):
        """x_perm: this rank's rows sorted by expert (counts[e] for expert e of all E); returns the
        experts' outputs in the same order, each computed on the rank that holds its expert
        (`experts`: this rank's, in order)."""
        per_rank = counts.reshape(self.group.size, -1).astype(np.int64)
        received = self.group.all_to_all(per_rank)  # row s: what rank s sends for each of my experts
        send, recv = per_rank.sum(axis=1), received.sum(axis=1)
        self.sent, self.received = send, recv  # of the last forward (the pictures and the byte count read them)
        arrived = all_to_all(x_perm, self.group, send, recv)  # dispatch
        order = expert_major_order(received)
        y_local = run_each_expert(experts, gather_rows(arrived, order), received.sum(axis=0))
        return all_to_all(gather_rows(y_local, inverse(order)), self.group, recv, send)  # combine


def local_experts(experts, group):
    """This rank's share of `experts` over the ep `group`, under their single-device names
    (`{global index}`: checkpoints and the single-device view join them by name)."""
    n_local = len(experts) // group.size
    local = ModuleList()
    for index in range(group.rank * n_local, (group.rank + 1) * n_local):
        setattr(local, str(index), experts[index])
    return local


def shard_experts(gpt, group):
    """Every MoE block of `gpt` keeps only this rank's experts of the ep `group` and reaches
    all of them by all-to-all, in place; the router and the settings are unchanged."""
    for block in gpt.blocks:
        if isinstance(block.mlp, MoE):
            if block.mlp.n_experts % group.size:
                raise ValueError(f"n_experts={block.mlp.n_experts} is not divisible by ep={group.size}")
            block.mlp.experts = local_experts(block.mlp.experts, group)
            block.mlp.dispatcher = AllToAllDispatcher(group)
    return gpt
