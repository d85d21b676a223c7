"""DualPipe and DualPipeV (its V-shaped, "cut in half" form), schedules written as data.

DeepSeek-V3's DualPipe (technical report, 2024, section 3.2.1) feeds micro-batches into both
ends of the pipeline, so every rank holds two copies of its stages. DualPipeV, the variant
this file follows (DeepSeek's reference code, github.com/deepseek-ai/DualPipe,
dualpipe/dualpipev.py, the "cut-in-half" procedure, whose phases are followed here step by
step; PyTorch's torch.distributed.pipelining has a ScheduleDualPipeV), keeps one direction and folds it:
a pipeline of 2p stages over p ranks, rank r holding stages r and 2p-1-r (placement "v",
placement.py). Chunk 0 (stage r) runs down the ranks, chunk 1 (stage 2p-1-r) back up;
the turn p-1 -> p stays on rank p-1 and the loss is on rank 0. Half DualPipe's devices for
the same stages, and one copy of the parameters.

The order of rank r, m >= 2p micro-batches, in eight phases (F0 = forward of chunk 0's next
micro-batch, B1 = backward of chunk 1's next, "zb": the backward split into B and W, its W
queued, W = run the oldest queued W):
    1  2(p-1-r) x F0                  fill chunk 0 down the ranks
    2  (r+1) x F0 F1                  the V turns: chunk 1 starts
    3  (p-1-r) x B1(zb) W F1          the first gradients; their W's fill the gaps
    4  (m-2p+r+1) x F0&B1 F1&B0       steady state: every forward paired with a backward
    5  (p-1-r) x B1 F1&B0
    6  (r+1) x B1 B0                  the second half of them zb (rank parity decides which)
    7  (p-1-r) x W B0(zb)
    8  (r+1) x W                      the queued W's
F&B is a forward of one chunk and a backward of the other, independent work that a GPU
overlaps with each other's communication (the report's figure 4). On this CPU the pair runs
in sequence, forward first: the gain measured here is the bubble, not the overlap.
Bubble (report's table 2, F&B the cost of an overlapped pair, B the whole backward):
    (PP/2 - 1)(F&B + B - 3W), PP the number of stages' ranks of the bidirectional DualPipe.

DualPipe itself (the report's figure 5; the reference code's dualpipe/dualpipe.py, DualPipe.step, as
of its commit 3da1bbe, followed step by step) runs the same eight phases on PP ranks (PP even, placement "mirror" of
placement.py): PP stages, each held twice. Rank i holds stage i of the pipeline running down the
ranks (chunk 0) and stage PP-1-i of its mirror image running up (chunk 1); the first m/2
micro-batches enter at rank 0 and go down, the other m/2 enter at rank PP-1 and go up. Each half
of the ranks sees the schedule from its own end: rank i runs the V's phases with
    p -> PP/2,  r -> min(i, PP-1-i),  m -> m/2,
and with its phase 0 the direction that enters at its own end (chunk 0 on ranks < PP/2, chunk 1
on the others: the reference's `phase ^= is_in_second_half`). Its special cases of the two middle
ranks only order their sends, which here, as for every schedule, `_place_communication` places.
Both copies of a stage are one
parameter of the model, so their gradients are summed after backward (tied.py, MirroredGradients):
parameters 2x, and the bubble is table 2's for PP ranks.
"""
from .schedules import Action, _check_sizes, _place_communication


def dualpipev(p, m):
    """DualPipeV on p ranks (2p stages, placement "v") for m >= 2p micro-batches."""
    _check_sizes(p, m, 1)
    if m < 2 * p:
        raise ValueError(f"dualpipev needs at least 2·p = {2 * p} micro-batches for p={p} ranks, got m={m}")
    return _place_communication([dualpipev_order(p, m, r) for r in range(p)], p, 2, placement="v")


def dualpipe(p, m):
    """Bidirectional DualPipe on p ranks (p even; p stages held twice, placement "mirror") for an even
    m >= 2p micro-batches: m/2 each way."""
    _check_sizes(p, m, 1)
    if p % 2:
        raise ValueError(f"dualpipe needs an even number of ranks (rank i pairs with rank p-1-i), got p={p}")
    if m < 2 * p or m % 2:
        raise ValueError(f"dualpipe needs an even number m ≥ 2·p = {2 * p} of micro-batches (m/2 each way) "
                         f"for p={p} ranks, got m={m}")
    return _place_communication([dualpipe_order(p, m, r) for r in range(p)], p, 2, placement="mirror")


def dualpipe_order(p, m, rank):
    """Rank `rank`'s compute order under DualPipe: the V's phases seen from its own end."""
    second_half = rank >= p // 2
    order = _Order(first=(0, m // 2), swap=second_half)
    return dualpipev_order(p // 2, m // 2, min(rank, p - 1 - rank), order)


def dualpipev_order(p, m, rank, order=None):
    """Rank `rank`'s compute order under DualPipeV (the phases of the module docstring); in terms
    of phases (chunks of the V), which `order` writes down as its chunks."""
    order = order or _Order()
    for _ in range(2 * (p - 1 - rank)):
        order.forward(0)
    for _ in range(rank + 1):
        order.forward(0)
        order.forward(1)
    for _ in range(p - 1 - rank):
        order.backward(1, split=True)
        order.weight()
        order.forward(1)
    # exercise 22.1: the steady state, forward-and-backward pairs
    # hint: a step is two F&B pairs, order.pair(forward_chunk, backward_chunk): each pairs a forward with a backward of
    # hint: the OTHER chunk, chunk 0's forward first. Count the steps so that, with the forwards of chunk 0 already run
    # hint: (2(p-1-rank) + rank + 1), every chunk forwards all m micro-batches.
    for _ in range(m - 2 * p + rank + 1):
        order.pair(0, 1)
        order.pair(1, 0)
    # end exercise
    for _ in range(p - 1 - rank):
        order.backward(1)
        order.pair(1, 0)
    split = False
    for i in range(rank + 1):  # from the middle on, the backwards leave their W's for the gaps
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        order.backward(1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        order.backward(0, split)
    for _ in range(p - 1 - rank):
        order.weight()
        order.backward(0, split=True)
    for _ in range(rank + 1):
        order.weight()
    return order.actions


class _Order:
    """A rank's compute order being written: the next micro-batch per chunk and the queued W's.
    The phases name chunks 0 and 1; `swap` writes them as chunks 1 and 0 (DualPipe's second half
    of the ranks); `first`: each chunk's first micro-batch (DualPipe's up direction: m/2)."""

    def __init__(self, first=(0, 0), swap=False):
        self.actions, self.queued, self.swap = [], [], int(swap)
        self.forwards, self.backwards = list(first), list(first)

    def forward(self, phase):
        chunk = phase ^ self.swap
        self.actions.append(Action("forward", self.forwards[chunk], chunk))
        self.forwards[chunk] += 1

    def backward(self, phase, split=False):
        """A whole backward, or (split) its B now and its W queued."""
        chunk = phase ^ self.swap
        mb = self.backwards[chunk]
        self.actions.append(Action("backward_input" if split else "backward", mb, chunk))
        if split:
            self.queued.append((mb, chunk))
        self.backwards[chunk] += 1

    def weight(self):
        self.actions.append(Action("backward_weight", *self.queued.pop(0)))

    def pair(self, forward_chunk, backward_chunk):
        """F&B: a forward of one chunk with a backward of the other (run one after the other here)."""
        self.forward(forward_chunk)
        self.backward(backward_chunk)
