"""Expert parallelism over an ep group of n ranks (GShard, DeepSpeed-MoE, Megatron-Core):
rank r holds experts [r·E/n, (r+1)·E/n) and keeps its own tokens. The MoE layer stays
itself: `shard_experts` leaves it only this rank's experts and gives it an AllToAllDispatcher
in place of its local one. Tokens travel ONE ROW PER (token, rank) (DeepSeek-V3 §3.2.2,
DeepEP): a token two of whose experts live on rank r goes there once. In one MoE layer:

    route       this rank's tokens, as on one device (minitensor.nn.moe): per assignment its
                token, expert, gate and whether it is kept
    rows        the distinct (rank, token) pairs of the kept assignments, rank-major, tokens in
                order; each row carries x_t and its gates for rank r's E/n experts (−1 where t
                did not choose the expert: a gate is ≥ 0, so the mark cannot be a gate)
    counts      one small all-to-all: how many rows each rank sends me
    dispatch    all-to-all of [x | gates]: the rows for rank r (contiguous) go to rank r
    experts     rank r runs each of its experts on the rows that chose it and sums their
                gate-weighted outputs per row (mix_experts, as one device does): one row back
    combine     the all-to-all back: every combined row returns to its token's rank, which
                adds its rows from the ranks it reached into the token

A token whose kept experts lie on D ranks sends D rows (the one to its own rank never
leaves it) and gets D back: device-limited routing (at most M ranks) caps D, so the bytes
fall with M. Backward mirrors it: AllToAll's backward is the all-to-all with the splits
swapped, and a gather's backward is the scatter of its rows (minitensor.nn.moe_ops); the
gates travel in the differentiable rows, so the router's gradient comes back with x's. An
expert's gradient on rank r sums what every rank of the ep group sent it; its replicas (the
edp group, the ranks of the other ep groups at r's place) hold the rest of the batch's
(hybrid/sections.py).
"""
import numpy as np

import minitensor as mt
from minitensor.autograd import Function
from minitensor.nn.module import ModuleList
from minitensor.nn.moe import MoE, Routing, mix_experts
from minitensor.nn.moe_ops import gather_rows, scatter_add_rows
from minitensor.shape_ops import concat

NOT_CHOSEN = -1.0  # in a row's gate column: the token did not choose this expert


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


def rows_per_rank(routing, n_tokens, n_local):
    """(rank, token, row, local): the rows to send, one per distinct (rank, token) pair of the
    kept assignments, rank-major and in token order, as their ranks and tokens; each kept
    assignment's row among them, and its expert's index on its rank (n_local experts a rank)."""
    # exercise 20.6: one row per (token, rank)
    # hint: the kept assignments' (rank, token) pairs as one number, rank first: expert // n_local · n_tokens + token;
    # hint: np.unique sorts the distinct ones and (return_inverse) says which one each assignment is.
    kept = np.flatnonzero(routing.kept)
    expert = routing.expert[kept]
    pairs, row = np.unique(expert // n_local * n_tokens + routing.token[kept], return_inverse=True)
    return pairs // n_tokens, pairs % n_tokens, row, expert % n_local
    # end exercise


def gate_columns(routing, row, local, n_rows, n_local):
    """(n_rows, n_local) Tensor: the kept assignments' gates at (row, local expert), NOT_CHOSEN
    elsewhere; differentiable in routing.weight."""
    where = row * n_local + local
    marks = np.full(n_rows * n_local, NOT_CHOSEN, routing.weight.dtype)
    marks[where] = 0
    gates = scatter_add_rows(gather_rows(routing.weight, np.flatnonzero(routing.kept)), where, n_rows * n_local)
    return (gates + mt.tensor(marks)).reshape(n_rows, n_local)


def arrived_routing(gates):
    """The Routing of the rows that arrived, from their (rows, n_local) gate columns: each
    chosen (row, local expert), row by row, its gate gathered differentiably."""
    rows, n_local = gates.shape
    row, local = np.nonzero(gates.data != NOT_CHOSEN)
    return Routing(row, local, gather_rows(gates.reshape(-1), row * n_local + local), np.ones(row.size, bool))


class AllToAllDispatcher:
    """The MoE layer's dispatcher (minitensor.nn.moe.LocalDispatcher's interface) when its
    experts are spread over the ep `group`: the layer holds only this rank's. After each
    forward, `sent` and `received`: the rows this rank sent to and received from each rank
    (one per (token, rank); its own rows at its own index)."""

    def __init__(self, group):
        self.group = group
        self.sent = self.received = None

    def run_experts(self, x, routing, experts):
        """(N, C): each of this rank's tokens x the sum of its kept experts' gate-weighted outputs,
        each expert run on the rank that holds it (`experts`: this rank's, in order)."""
        n_tokens, width, n_local = x.shape[0], x.shape[1], len(experts)
        rank, token, row, local = rows_per_rank(routing, n_tokens, n_local)
        send = np.bincount(rank, minlength=self.group.size)
        recv = self.group.all_to_all(send)  # counts: what each rank sends me
        self.sent, self.received = send, recv  # of the last forward (the pictures and the byte count read them)
        rows = concat([gather_rows(x, token), gate_columns(routing, row, local, token.size, n_local)], axis=1)
        arrived = all_to_all(rows, self.group, send, recv)  # dispatch
        y = mix_experts(arrived[:, :width], arrived_routing(arrived[:, width:]), experts)
        return scatter_add_rows(all_to_all(y, self.group, recv, send), token, n_tokens)  # combine


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
