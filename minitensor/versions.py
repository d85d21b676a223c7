"""Version counters (PyTorch's `t._version`): how autograd notices a saved array written in place.

A node that saves an array for backward (an input's, or its own output's) records the
version of the tensor that owns it; every in-place write into a tensor's array adds one
(minitensor.inplace). Backward compares before calling the node: a moved version means
the saved values are not the ones forward used, and the gradient would be silently wrong,
so backward refuses, naming the node. A view an op made keeps its own counter (PyTorch
shares one between views), so write in place into the tensor itself, not into a view of it.
"""


class Version:
    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


def version_of(tensor):
    if tensor._version_counter is None:
        tensor._version_counter = Version()
    return tensor._version_counter


def bump(tensor):
    """`tensor`'s array was just written in place."""
    version_of(tensor).count += 1


def _owns_saved(array, saved):
    return any(s is array or getattr(s, "base", None) is array for s in saved)


def record(node, tensors):
    """The (counter, count) pairs of the tensors among `tensors` whose arrays `node` saved.
    Arrays a saved_tensors_hooks pair packed are the hooks' to keep (not tuples: skipped)."""
    saved = getattr(node, "saved", ())
    if type(saved) is not tuple or not saved:
        return ()
    return tuple((version_of(t), version_of(t).count) for t in tensors if _owns_saved(t.data, saved))


def check(node):
    """Refuse to run `node.backward` on saved arrays written in place since forward."""
    for version, count in getattr(node, "versions", ()):
        if version.count != count:
            raise RuntimeError(
                f"an array {node.name} saved for backward was modified by an in-place operation (its tensor is at "
                f"version {version.count}, {node.name} saved version {count}): do the in-place update after "
                f"backward, or on a clone (x = x.clone())")
