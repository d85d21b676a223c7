"""The order of ZeRO-3's backward all-gathers, as data a reader can check.

A forward pass records its uses of units (`Use`, in a `Pass`); the graph keeps a
`SavedParameter` (a place in the gathered copy) instead of each parameter array, and the
copy is freed when the last one is gone.

A pass's backward gathers are its units' uses in reverse; every rank must issue them all,
in that order, whatever its own loss reaches, or the collectives of two ranks pair the
wrong messages. `gathers_due` says which to issue when an entry is read; `check_gathers`
runs it on every rank at once, as chapter 7's checker runs a pipeline schedule.
"""
import numpy as np

from .flat_units import owner


class Use:
    """One use of a unit in one forward pass: its backward gather (an entry of the pass's
    list), the gathered copy while backward needs it, and how many saved references remain."""

    def __init__(self, unit, a_pass):
        self.unit, self.a_pass = unit, a_pass
        self.full, self.request, self.refs = None, None, 0
        self.issued, self.needed = False, True


class SavedParameter:
    """What the graph keeps instead of a parameter array: the use and where in its flat copy."""

    def __init__(self, use, array, full):
        self.use = use
        self.offset = array.__array_interface__["data"][0] - owner(full).__array_interface__["data"][0]
        self.shape, self.strides, self.dtype = array.shape, array.strides, array.dtype
        use.refs += 1

    def view(self):
        return np.ndarray(self.shape, self.dtype, buffer=owner(self.use.full), offset=self.offset,
                          strides=self.strides)

    def __del__(self):  # the node that saved it is gone: free the copy after its last reference
        use = self.use
        use.refs -= 1
        if use.refs == 0:
            use.full = None


class Pass:
    """One forward pass through a Sharding: its uses in the order they finished; backward
    gathers every one again, in reverse (fixed when the pass ends). A use whose graph saved
    no parameter (an embedding's backward needs only the indices) is never read: gathered
    in its place all the same, so the count is the formula's, two gathers per use."""

    def __init__(self):
        self.uses, self.started, self.gathers = [], [], []

    def close(self):
        self.gathers = self.uses[::-1]
        for use in self.gathers:
            use.needed = use.refs > 0



def gathers_due(needed, issued, position, prefetch):
    """Which backward gathers of a pass (indices into its list) to issue now that entry
    `position` is read: every one not yet issued up to it, `prefetch` more, and those after
    it that this rank will never read until the next it will (needed[k] False): so every
    rank issues the whole list, in order, whatever its loss reaches."""
    # exercise 14.2: the stage-3 backward gathers, in the pass's order
    # hint: entry k is due if not issued[k] and either k <= position + prefetch, or every entry
    # hint: position+1 .. k is one this rank will not read (not needed).
    due = []
    for k in range(len(needed)):
        unneeded_between = not any(needed[position + 1:k + 1])
        if not issued[k] and (k <= position + prefetch or unneeded_between):
            due.append(k)
    return due
    # end exercise


def check_gathers(needed_by_rank, prefetch):
    """Simulate one pass's backward gathers on every rank (needed_by_rank[r][k]: does rank r's
    backward read entry k; ranks read their entries in order) under `gathers_due`, with
    collectives that complete once every rank has issued them. Returns each rank's issue
    order; raises ValueError on a deadlock or if two ranks issue different sequences."""
    ranks = len(needed_by_rank)
    length = len(needed_by_rank[0])
    issued = [[False] * length for _ in range(ranks)]
    sequences = [[] for _ in range(ranks)]
    reads = [[k for k in range(length) if needed[k]] for needed in needed_by_rank]
    progress = True
    while progress:
        progress = False
        for r in range(ranks):
            if reads[r]:
                position = reads[r][0]
                for k in gathers_due(needed_by_rank[r], issued[r], position, prefetch):
                    issued[r][k] = True
                    sequences[r].append(k)
                    progress = True
                if all(issued[s][position] for s in range(ranks)):  # the wait completes
                    reads[r].pop(0)
                    progress = True
            elif not all(issued[r]):  # the step's sync point: issue the rest, in order
                for k in range(length):
                    if not issued[r][k]:
                        issued[r][k] = True
                        sequences[r].append(k)
                progress = True
    stuck = {r: reads[r][0] for r in range(ranks) if reads[r]}
    if stuck:
        raise ValueError(f"deadlock: ranks wait for backward gathers {stuck}, issued {sequences}")
    if any(sequence != sequences[0] for sequence in sequences):
        raise ValueError(f"ranks issue different gather sequences: {sequences}")
    return sequences
