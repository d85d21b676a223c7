"""Counting the activations a pipeline stage holds between a micro-batch's forward and
its backward: the quantity that separates GPipe (all m micro-batches at once) from 1F1B
(at most p - rank) and that recomputation shrinks to the stage inputs."""
import numpy as np

from minitensor import graph
from minitensor.autograd import topological_order
from minitensor.nn.module import Parameter


def activation_bytes(tensor):
    """Bytes that the graph behind `tensor` keeps alive for backward: every array its
    nodes saved, plus the non-parameter leaves (a received activation), each array once.
    Parameters are model state, not activations, and are left out."""
    if tensor._node is None:
        return 0
    tensors = topological_order(tensor)
    arrays = [a for t in tensors if t._node is not None for a in graph.saved_arrays(t._node)]
    arrays += [t.data for t in tensors if t._node is None and not isinstance(t, Parameter)]
    parameters = {id(t.data) for t in tensors if isinstance(t, Parameter)}
    unique = {id(a): a for a in arrays if isinstance(a, np.ndarray) and id(a) not in parameters}
    return sum(a.nbytes for a in unique.values())


class ActivationMeter:
    """Live stored activations, keyed by (micro-batch, chunk), and their peaks."""

    def __init__(self):
        self.live = {}
        self.peak_count = 0
        self.peak_bytes = 0

    def stored(self, key, nbytes):
        self.live[key] = nbytes
        self.peak_count = max(self.peak_count, len(self.live))
        self.peak_bytes = max(self.peak_bytes, sum(self.live.values()))

    def freed(self, key):
        del self.live[key]
