"""Zero-bubble schedules: the backward split into B and W, and W moved into the bubbles.

1F1B idles p-1 slots of (F + B + W) on every rank: the backward of a stage cannot
start before the next stage's backward has produced its input gradient. Only the B
half (backward_input: the gradient of the stage's input) is on that chain; the W half
(backward_weight: the weights' gradients) is needed by nobody until the optimizer step.
So a rank can run its W's whenever it would otherwise wait (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024, section 3.1 and figure 3, the handcrafted ZB-H1 and
ZB-H2). minitensor.split_backward makes the split; these functions only order it.

ZB-H1 (same activation memory as 1F1B). Rank r keeps 1F1B's warm-up of p-1-r forwards,
then runs F, B, W per micro-batch, except that its W's are loosened from their B's and
run r micro-batches late: the r W's still pending when the last gradient arrives fill
the cool-down, where 1F1B waits for the backward chain. In flight (forward done, W not
done) on every rank: at most p micro-batches, 1F1B's peak (on its rank 0).
    bubble (F = B = W = t, m >= p): (p-1)·t per rank next to 3·m·t of work, a third
    of 1F1B's 3·(p-1)·t. As a share of the step, for any m,
    1 - 3m / (2m + p - 1 + max(m, p)), which is (p-1)/(3m + p-1) once m >= p (with
    fewer micro-batches rank 0 runs out of forwards to do while the first B travels).

ZB-H2 (more memory, no bubble inside a rank's step). Rank r warms up with 2(p-r)-1
forwards, so that its first B arrives exactly when its forwards are done; then at each
time step it runs, in this order of preference, a B whose gradient has arrived, a
forward (at most 2(p-r)-1 micro-batches waiting for their B and 2p-1 in flight), a
pending W. That is the paper's priority rule (B before F before W, under the memory
limit) played out at F = B = W; the W's left over collect at the tail, turning 1F1B's
trapezoid into a parallelogram: from m >= 2p-1 on, no rank ever waits between its first
and its last compute. Within one step the last rank still starts p-1 forwards late and
rank 0 still finishes first, so the step's bubble equals ZB-H1's; the parallelogram pays
off when step k+1 may start on rank 0 while the last rank finishes step k, which the
optimizer step forbids as long as it needs every rank's W (a global gradient-norm clip,
an inf/NaN check): the paper's "optimizer post-validation" steps at once and rolls back
in the rare step where the check fails (section 4).
"""
from .schedules import Action, _check_sizes, _place_communication


def zb_h1(p, m):
    """ZB-H1: 1F1B's order with the backward split and rank r's W's r micro-batches late."""
    _check_sizes(p, m, 1)
    return _place_communication([_h1_order(p, m, r) for r in range(p)], p, 1)


def _h1_order(p, m, rank):
    """Rank `rank`'s compute order under ZB-H1: Action("forward" | "backward_input" |
    "backward_weight", micro-batch), in the order the rank runs them."""
    # exercise 11.1: ZB-H1's compute order
    # hint: start from 1F1B's order (chapter 8: the warm-up, then one forward and one backward per micro-batch),
    # hint: with each backward split into its B and its W. Delay a rank's W's just enough that the ones still
    # hint: owed fill the cool-down, where 1F1B waits — but never so much that more micro-batches are held than
    # hint: 1F1B holds (a micro-batch is held from its F until its W). Every W comes after its own B.
    warmup, lag = min(p - 1 - rank, m), rank
    order = [Action("forward", mb) for mb in range(warmup)]
    for mb in range(m):
        if warmup + mb < m:
            order.append(Action("forward", warmup + mb))
        order.append(Action("backward_input", mb))
        if mb >= lag:
            order.append(Action("backward_weight", mb - lag))
    return order + [Action("backward_weight", mb) for mb in range(max(m - lag, 0), m)]
    # end exercise


def zb_h2(p, m):
    """ZB-H2: a 2(p-r)-1 forward warm-up, then B before F before W at every step."""
    _check_sizes(p, m, 1)
    return _place_communication(_h2_orders(p, m), p, 1)


def _h2_orders(p, m):
    """Play the priority rule out on p ranks, every compute one time unit: each rank's
    compute order. Micro-batch counters per rank: forwards, B's and W's done."""
    done = {}  # (kind, micro-batch, rank) -> time it finished
    forwards, inputs, weights = [0] * p, [0] * p, [0] * p
    orders, time = [[] for _ in range(p)], 0
    while any(w < m for w in weights):
        chosen = [_h2_choice(p, m, r, time, done, forwards[r], inputs[r], weights[r]) for r in range(p)]
        if not any(chosen):
            raise ValueError(f"zb-h2 for p={p}, m={m} made no progress at time {time}")
        for rank, kind in enumerate(chosen):
            if kind is None:
                continue
            counter = {"forward": forwards, "backward_input": inputs, "backward_weight": weights}[kind]
            orders[rank].append(Action(kind, counter[rank]))
            done[kind, counter[rank], rank] = time + 1
            counter[rank] += 1
        time += 1
    return orders


def _h2_choice(p, m, rank, time, done, forwards, inputs, weights):
    """What `rank` starts at `time`: a B, else an F, else a W, else nothing."""
    def finished(kind, mb, r):
        return done.get((kind, mb, r), time + 1) <= time

    if inputs < m and finished("forward", inputs, rank) and (
            rank == p - 1 or finished("backward_input", inputs, rank + 1)):
        return "backward_input"
    if (forwards < m and forwards - inputs < 2 * (p - rank) - 1 and forwards - weights < 2 * p - 1
            and (rank == 0 or finished("forward", forwards, rank - 1))):
        return "forward"
    return "backward_weight" if weights < inputs else None
