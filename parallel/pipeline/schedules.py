"""Pipeline schedules as data: for every rank, an ordered list of `Action`s.

Vocabulary (Megatron-LM's):
    p  ranks in the pipeline group (`pipeline_model_parallel_size`)
    m  micro-batches per optimizer step (`num_microbatches`)
    v  model chunks per rank (`virtual_pipeline_model_parallel_size`)
The model is cut into stages and rank r holds chunks c = 0..v-1; which stage a chunk
is, the *placement* ("loop": Megatron's interleaving, "v": DualPipeV's fold, "mirror":
DualPipe's two directions), is placement.py's.

Actions (`Action.kind`):
    recv_fwd   receive the input activation of (micro-batch, chunk) from `peer`
    forward    run the chunk's forward on that input (stage 0: on the data)
    send_fwd   send the chunk's output activation to `peer`
    recv_bwd   receive the gradient of the chunk's output from `peer`
    backward   run the chunk's backward (last stage: from the loss)
    send_bwd   send the gradient of the chunk's input to `peer`
The zero-bubble schedules (zero_bubble.py) split `backward` in two:
    backward_input   B: only the gradients on the way to the chunk's input (what
                     send_bwd sends); the weight part waits
    backward_weight  W: the chunk's weight gradients of that micro-batch; no message
`chunk` is always the chunk *on the acting rank*: a send_fwd of stage s is
received by a recv_fwd of stage s+1 (which on the wrap-around from rank p-1
to rank 0 is the next chunk). The first stage has no recv_fwd/send_bwd, the
last no send_fwd/recv_bwd. With one rank (p == 1) there is no communication.

Semantics the executor implements and `checker.py` proves: every action is
*blocking*. A receive waits for its data; a send completes only when the
peer posts the matching receive (rendezvous, like MPI_Ssend). A send and a
receive match by (source, destination, kind, micro-batch, chunk). A list
that runs under rendezvous also runs under any buffering (MPI_Send, isend).

Why the lists never deadlock. Naive 1F1B ("receive right before a compute,
send right after it") deadlocks under rendezvous in the steady state: stage
s sends activation k forward while stage s+1 sends gradient j back, both
blocked in a send. Megatron avoids it with *combined* calls
(send_forward_recv_backward = batched isend/irecv). We keep single blocking
actions and avoid it by *ordering* instead, with one rule for all schedules:
    the lists are the per-rank projections of ONE global sequence of events,
    in which each message (its send and its receive) is a single event.
Proof: take the first event of the global sequence not done yet; everything
before it is done, so if it is a compute its rank is at it, and if it is a
message both its ranks are at it and the rendezvous completes. So some
event always makes progress. `_place_communication` builds that sequence by
simulating the compute order (forward costs 1, backward 2) and passing each
message at the first moment both of its ranks are between computes. So a
receive may come a little before it is needed (1F1B steady state: a stage
takes gradient j before it sends activation k, while its successor sends
gradient j before it takes activation k), and a send may wait until after
the rank's next compute. At those costs strict rendezvous loses no time:
the checker's simulated bubble equals the theory for all three schedules.
Under other costs the lists stay correct; rendezvous may then add waits to
the interleaved schedule (buffered sends, like MPI's eager Send, do not).
The executor therefore needs only blocking `send`/`recv`, in list order.

Gradient accumulation order: every schedule runs the backward passes (the
W's, when split) of a chunk in increasing micro-batch order, so all of them
sum micro-batch gradients in the same order (bitwise equal float results).
"""
from dataclasses import dataclass

from .placement import num_stages, rank_and_chunk, stage_of

COMPUTE_KINDS = ("forward", "backward", "backward_input", "backward_weight")
KINDS = ("recv_fwd", "forward", "send_fwd", "recv_bwd", "backward", "send_bwd", "backward_input", "backward_weight")
# Relative costs used only to order the communication (a backward computes
# two matrix products per forward one, B and W one each); any positive costs
# give valid lists.
PLACEMENT_COST = {"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}
# What a compute leaves done, in the terms `prerequisites` asks about: a full
# backward is both halves at once.
PRODUCES = {"forward": ("forward",), "backward": ("backward_input", "backward_weight"),
            "backward_input": ("backward_input",), "backward_weight": ("backward_weight",)}


@dataclass(frozen=True)
class Action:
    """One step of a rank's list; `peer` is the other rank of a send/recv."""
    kind: str
    microbatch: int
    chunk: int = 0
    peer: int | None = None

    @property
    def is_compute(self):
        return self.kind in COMPUTE_KINDS

    def __str__(self):
        text = f"{self.kind}(mb={self.microbatch}, chunk={self.chunk})"
        if self.peer is None:
            return text
        direction = "to" if self.kind.startswith("send") else "from"
        return f"{text} {direction} rank {self.peer}"


def gpipe(p, m):
    """GPipe: every rank runs all m forwards, then all m backwards."""
    _check_sizes(p, m, 1)
    # exercise 07.1: the GPipe compute order
    # hint: `orders[r]` is rank r's compute list (chunk 0), in the order it runs. GPipe has no steady
    # hint: phase: which warm-up length makes a warm-up / steady / cool-down order all forwards, then all backwards?
    micro = [(mb, 0) for mb in range(m)]
    orders = [_warmup_steady_cooldown(micro, micro, warmup=m) for _ in range(p)]
    # end exercise
    return _place_communication(orders, p, 1)


def one_f_one_b(p, m):
    """1F1B (PipeDream-Flush): rank r warms up with min(p-r-1, m) forwards,
    then alternates one forward and one backward, then drains backwards.
    At most p-r micro-batches keep their activations on rank r (GPipe: m)."""
    _check_sizes(p, m, 1)
    # exercise 08.2: the 1F1B warm-up of each rank
    # hint: after the warm-up a rank alternates one forward and one backward; the warm-up runs just enough
    # hint: forwards to keep every LATER stage busy: one per later stage (the last rank: none), never more than m.
    micro = [(mb, 0) for mb in range(m)]
    orders = [_warmup_steady_cooldown(micro, micro, warmup=min(p - r - 1, m))
              for r in range(p)]
    # end exercise
    return _place_communication(orders, p, 1)


def interleaved(p, m, v):
    """Megatron-LM's interleaved 1F1B with v chunks per rank.

    Rank r walks m*v (micro-batch, chunk) units. Forward unit k belongs to
    the group of p micro-batches k // (p*v), takes chunk (k mod p*v) // p
    and micro-batch group*p + k mod p: p micro-batches go through chunk 0,
    then the same p through chunk 1, ... Backward units visit the chunks in
    reverse. Warm-up is (p-r-1)*2 + (v-1)*p forward units (Megatron's
    count), then one forward + one backward unit per step. The bubble
    shrinks from (p-1)/m to (p-1)/(v*m) of the compute time. Megatron
    requires m % p == 0 (units go in groups of p micro-batches); v == 1 is
    exactly `one_f_one_b`.
    """
    _check_sizes(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if p == 1:
        raise ValueError(f"interleaved schedule needs p >= 2 ranks for v={v} chunks "
                         f"(on one rank the chunks are just consecutive layers; use v=1)")
    if m % p != 0:
        raise ValueError(f"interleaved schedule needs the number of micro-batches m={m} "
                         f"to be a multiple of the pipeline size p={p} (as in Megatron-LM)")

    def unit(k, backward):
        group, k_in_group = divmod(k, p * v)
        chunk = k_in_group // p
        return group * p + k % p, (v - 1 - chunk if backward else chunk)

    forwards = [unit(k, backward=False) for k in range(m * v)]
    backwards = [unit(k, backward=True) for k in range(m * v)]
    orders = [_warmup_steady_cooldown(forwards, backwards,
                                      warmup=min((p - r - 1) * 2 + (v - 1) * p, m * v))
              for r in range(p)]
    return _place_communication(orders, p, v)


def _check_sizes(p, m, v):
    for name, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"pipeline size {name} must be a positive int, got {value!r}")


def _warmup_steady_cooldown(forwards, backwards, warmup):
    """Compute order: `warmup` forwards, then forward/backward pairs, then
    the remaining backwards. warmup = len(forwards) gives GPipe."""
    # exercise 08.1: warm-up, steady 1F1B, cool-down
    # hint: `warmup` forwards; then pair each remaining forward with the next backward (forward first);
    # hint: then the backwards that are left. Items of `forwards`/`backwards` are (micro-batch, chunk).
    order = [Action("forward", mb, c) for mb, c in forwards[:warmup]]
    for (fmb, fc), (bmb, bc) in zip(forwards[warmup:], backwards):
        order += [Action("forward", fmb, fc), Action("backward", bmb, bc)]
    steady = len(forwards) - warmup
    order += [Action("backward", mb, c) for mb, c in backwards[steady:]]
    return order
    # end exercise


def prerequisites(kind, microbatch, stage, last_stage):
    """The work (kind, micro-batch, stage), in PRODUCES' terms, that must be done
    before this compute: the forward of the stage before; for a backward (or its
    B half), its own forward and the input gradient of the stage after (the last
    stage starts from the loss); for a W, its own B."""
    # exercise 07.2: what a compute waits for
    # hint: a forward needs the previous stage's forward of the same micro-batch (stage 0: nothing);
    # hint: a backward (or its B half) needs its own forward and the next stage's input gradient (the last
    # hint: stage: only its forward); a W needs its own B.
    if kind == "forward":
        return [("forward", microbatch, stage - 1)] if stage > 0 else []
    if kind == "backward_weight":
        return [("backward_input", microbatch, stage)]
    after = [("backward_input", microbatch, stage + 1)] if stage < last_stage else []
    return [("forward", microbatch, stage)] + after
    # end exercise


def _place_communication(orders, p, v, placement="loop"):
    """Turn per-rank compute orders into full action lists (see the module
    docstring). Simulate the computes at their usual relative cost: at each
    time step first pass every waiting message whose two ranks are both
    between computes, then start every compute whose inputs are on its rank.
    The order in which this happens is one global sequence of events; each
    rank's list is that sequence seen from the rank."""
    last_stage = num_stages(p, v, placement) - 1
    schedule = [[] for _ in range(p)]
    available = {}               # (rank, kind, mb, stage) -> time the data is there
    waiting = []                 # (send, recv) messages not passed yet
    free_at, position, time = [0] * p, [0] * p, 0
    while waiting or any(position[r] < len(orders[r]) or free_at[r] > time for r in range(p)):
        for send, recv in list(waiting):
            sender, receiver = recv.peer, send.peer
            if max(free_at[sender], free_at[receiver]) <= time:
                schedule[sender].append(send)
                schedule[receiver].append(recv)
                waiting.remove((send, recv))
                available[(receiver, *_compute_of(send, sender, p, placement))] = time
        started = False
        for r in range(p):
            if free_at[r] > time or position[r] == len(orders[r]):
                continue
            compute = orders[r][position[r]]
            kind, mb, stage = _compute_of(compute, r, p, placement)
            if all(available.get((r, *need), time + 1) <= time
                   for need in prerequisites(kind, mb, stage, last_stage)):
                schedule[r].append(compute)
                free_at[r] = time + PLACEMENT_COST[kind]
                available.update({(r, done, mb, stage): free_at[r] for done in PRODUCES[kind]})
                waiting += _message_of(compute, r, p, last_stage, placement)
                position[r] += 1
                started = True
        if not (started or waiting or any(f > time for f in free_at)) and \
                any(position[r] < len(orders[r]) for r in range(p)):
            raise ValueError(f"compute order waits in a circle at positions {position}")
        time += 1
    return schedule


def _compute_of(action, rank, p, placement):
    """(kind, micro-batch, stage) of the compute an action runs or carries."""
    kind = {"send_fwd": "forward", "send_bwd": "backward_input"}.get(action.kind, action.kind)
    return kind, action.microbatch, stage_of(rank, action.chunk, p, placement)


def _message_of(compute, rank, p, last_stage, placement):
    """[(send, recv)] carrying `compute`'s result to the next stage, or [] (also when the
    next stage is on the same rank: the V's turn, handed over in memory)."""
    stage = stage_of(rank, compute.chunk, p, placement)
    if compute.kind == "forward" and stage < last_stage:
        to_stage, send, recv = stage + 1, "send_fwd", "recv_fwd"
    elif compute.kind in ("backward", "backward_input") and stage > 0:
        to_stage, send, recv = stage - 1, "send_bwd", "recv_bwd"
    else:
        return []
    peer, peer_chunk = rank_and_chunk(to_stage, p, placement, compute.chunk)
    if peer == rank:
        return []
    return [(Action(send, compute.microbatch, compute.chunk, peer),
             Action(recv, compute.microbatch, peer_chunk, rank))]
