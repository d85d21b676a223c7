"""An asynchronous parameter server with bounded staleness (stale-synchronous parallel).

    rank 0, the server:  holds θ and the optimizer; version v of θ exists after v rounds
    ranks 1..W, workers: round t: pull a version τ of θ ─▶ gradient on its own batch ─▶ push
    server:              θ_{t+1} = optimizer step with mean_w g_w^t, once every worker pushed round t

    g_w^t = ∇L_w^t(θ_τ)  with  t − s ≤ τ(w, t) ≤ t       (s: the staleness bound)

A worker does not wait for the newest parameters: it starts round t as soon as it has
pushed round t − 1 and version t − s exists, on the newest version there is then. With
s = 0 every worker waits for θ_t: synchronous SGD. With s > 0 fast workers run ahead on
stale parameters instead of idling (Ho et al. 2013, "More effective distributed ML via a
stale synchronous parallel parameter server"; Dean et al. 2012).

Which version a worker gets depends on who is fast. Here that is a SCRIPT: each worker's
time per round (`scripted_delays`, from a seed) runs through a virtual clock
(`staleness_schedule`), and the server sends each worker the version the clock says. So a
run is deterministic, however the threads or processes are scheduled, and a test replays
it in one process (`simulate`). The messages are real: the server `isend`s parameters
and `recv`s gradients, each worker `recv`s and `send`s, flat through one `Bucket`.
"""
import numpy as np

from .reducer import Bucket

PARAMS, GRADS = 1, 2  # message tags


def scripted_delays(seed, workers, steps):
    """Virtual seconds of each worker's rounds, [w][t]: uniform in [0.5, 1.5), and a straggler
    round (4× longer) with probability 0.2, as a machine that is sometimes busy elsewhere."""
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0.5, 1.5, (workers, steps))
    return np.where(rng.random((workers, steps)) < 0.2, 4 * delays, delays)


def staleness_schedule(delays, staleness):
    """τ[w][t], the version of θ worker w computes its round-t gradient on (module docstring)."""
    workers, steps = np.shape(delays)
    ready = [0.0]  # ready[v]: virtual time at which version v exists
    finish = [0.0] * workers
    tau = [[0] * steps for _ in range(workers)]
    for t in range(steps):
        for w in range(workers):
            # exercise 13.2: a worker's stalest allowed start
            # hint: start when this worker finished its last round AND version t − staleness exists;
            # hint: take the newest version ready by then (never newer than t), then finish after its delay.
            start = max(finish[w], ready[max(0, t - staleness)])
            tau[w][t] = max(v for v, when in enumerate(ready) if when <= start)
            finish[w] = start + delays[w][t]
            # end exercise
        ready.append(max(finish))  # the server steps once the last gradient of round t arrived
    return tau


def describe_roles(group):
    return (f"parameter server: rank 0 holds the parameters and the optimizer; ranks 1..{group.size - 1} "
            f"are workers")


def run_parameter_server(group, model, optimizer, batch_of, steps, tau, lr_of=None):
    """Train `model` on `group` (rank 0 the server, the others workers) for `steps` rounds with
    the schedule `tau` (staleness_schedule). batch_of(worker, step) -> (idx, targets);
    lr_of(step): the server optimizer's learning rate for round `step` (default: unchanged).
    Returns the server's final parameters (flat) on rank 0, the worker's losses elsewhere."""
    workers = group.size - 1
    if workers < 1 or len(tau) != workers:
        raise ValueError(f"a parameter server needs 1 server + {len(tau)} workers, the group has {group.size} ranks")
    params = [p for p in model.parameters() if p.requires_grad]
    flat = Bucket(params)
    if group.rank == 0:
        return serve(group, optimizer, flat, steps, tau, lr_of)
    return work(group, model, flat, batch_of, group.rank - 1, steps)


def set_lr(optimizer, lr_of, step):
    if lr_of is not None:
        optimizer.defaults["lr"] = lr_of(step)


def serve(group, optimizer, flat, steps, tau, lr_of):
    workers = len(tau)
    versions, sends = {0: flat.pack_values().copy()}, []
    for v in range(steps + 1):
        for t in range(v, steps):  # in round order, as each worker receives them (τ grows with t)
            sends += [group.isend(versions[v], w + 1, PARAMS) for w in range(workers) if tau[w][t] == v]
        if v == steps:
            break
        total, incoming = np.zeros_like(flat.buffer), np.empty_like(flat.buffer)
        for w in range(workers):  # rank order: the sum is the same bits every run
            total += group.recv(incoming, w + 1, GRADS)
        flat.buffer[...] = total
        flat.unpack_values(versions[v])
        flat.unpack(divisor=workers)  # .grad = the mean gradient of round v
        set_lr(optimizer, lr_of, v)
        optimizer.step()
        versions[v + 1] = flat.pack_values().copy()
    for request in sends:
        request.wait()
    return versions[steps]


def work(group, model, flat, batch_of, worker, steps):
    losses, incoming = [], np.empty_like(flat.buffer)
    for t in range(steps):
        flat.unpack_values(group.recv(incoming, 0, PARAMS))
        for p in flat.params:
            p.grad = None
        _, loss = model(*batch_of(worker, t))
        loss.backward()
        group.send(flat.pack(), 0, GRADS)
        losses.append(loss.item())
    return losses


def simulate(model, optimizer, batch_of, steps, tau, lr_of=None):
    """The same training in one process, in the schedule's order: the reference of a run."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = Bucket(params)
    versions = {0: flat.pack_values().copy()}
    for t in range(steps):
        total = np.zeros_like(flat.buffer)
        for w, row in enumerate(tau):
            flat.unpack_values(versions[row[t]])
            for p in params:
                p.grad = None
            model(*batch_of(w, t))[1].backward()
            total += flat.pack()
        flat.buffer[...] = total
        flat.unpack_values(versions[t])
        flat.unpack(divisor=len(tau))
        set_lr(optimizer, lr_of, t)
        optimizer.step()
        versions[t + 1] = flat.pack_values().copy()
    return versions[steps]
