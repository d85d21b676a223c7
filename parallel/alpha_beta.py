"""The α–β cost of a message and of the bandwidth-optimal collectives: the formulas below
both the simulated link (parallel.comm.link) and the planner (parallel.plan.cost).

A message of N bytes costs α (latency: seconds per message) + N·β (β = 1 / bandwidth:
seconds per byte). On n ranks, n−1 steps of one message of N/n bytes each:

    ring all-reduce                 2(n−1)(α + N/n·β)   reduce-scatter, then all-gather
    all-gather, reduce-scatter      (n−1)(α + N/n·β)
    send / recv                     α + N·β
    all-to-all (pairwise)           (n−1)α + S·β        S: the bytes this rank sends to the
                                                        others; it receives at the same time

The bytes each rank moves are those Group.stats() counts, so modelled time and counted
bytes cannot disagree. This module imports nothing.
"""


def ring_all_reduce(n, nbytes, alpha, beta):
    # exercise 10.1: the α–β cost of a ring
    # hint: count the ring's steps (chapter 3: a reduce-scatter, then an all-gather) and what one step costs:
    # hint: one message (α) of how many bytes (β each)?
    return 2 * (n - 1) * (alpha + nbytes / n * beta)
    # end exercise


def all_gather(n, nbytes, alpha, beta):
    """Also the cost of a reduce-scatter of the same total size."""
    # exercise 10.1: the α–β cost of a ring
    # hint: one phase of the ring: n − 1 steps of nbytes/n bytes.
    return (n - 1) * (alpha + nbytes / n * beta)
    # end exercise


def send_recv(nbytes, alpha, beta):
    return alpha + nbytes * beta


def all_to_all(n, sent_bytes, alpha, beta):
    """Pairwise exchange: n − 1 messages, one to each other rank, of this rank's sent bytes in all."""
    return (n - 1) * alpha + sent_bytes * beta
