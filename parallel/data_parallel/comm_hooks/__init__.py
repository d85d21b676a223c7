"""Communication hooks of the gradient reducer: what travels instead of a plain all-reduce.

As PyTorch DDP's `register_comm_hook`: `Reducer.register_comm_hook(hook)` (also on
`DataParallel` and `HybridGPT`) makes each packed bucket go through `hook(group, index,
bucket)`, which leaves the bucket's sum over the group in `bucket.buffer`. The default is
`parallel.data_parallel.reducer.allreduce_hook`. The compressing hooks change the mathematics on
purpose, and keep what they could not send (error feedback) for the next step:

    powersgd.py   PowerSGD (Vogels et al. 2019): a rank-r factorisation P·Qᵀ per matrix
    topk.py       top-k sparsification: the k largest entries and their indices
    sign.py       1-bit sign with one scale per tensor (scaled sign, EF-SignSGD)
    error_feedback.py  the shared error memory: compress(g + e), keep e = (g + e) − sent

Each hook's state (error buffers, PowerSGD's Q) is `state_dict()` / `load_state_dict()`.
`make_hook("powersgd:4")` parses the --compress flag.
"""
from .powersgd import PowerSGD
from .sign import SignCompression
from .topk import TopK

METHODS = ("none", "powersgd:R", "topk:RATIO", "sign")


def make_hook(spec, seed=0):
    """The hook named by --compress `spec` ('none' gives None: the reducer's all-reduce)."""
    name, _, value = spec.partition(":")
    try:
        if name == "none" and not value:
            return None
        if name == "powersgd":
            return PowerSGD(rank=int(value), seed=seed)
        if name == "topk":
            return TopK(ratio=float(value))
        if name == "sign" and not value:
            return SignCompression()
    except ValueError as error:
        raise ValueError(f"--compress {spec!r}: {error}") from None
    raise ValueError(f"--compress {spec!r} is not one of {', '.join(METHODS)}")


__all__ = ["METHODS", "PowerSGD", "SignCompression", "TopK", "make_hook"]
