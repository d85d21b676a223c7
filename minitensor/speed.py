"""The engine's speed optimisations, each with one switch, all on by default.

Every optimisation below sits in one named place whose comment says what it buys;
turning it off runs the plain version, with the same results (the tests run both):

    flat_optimizer     AdamW / SGD update every parameter of a dtype in a few large
                       vectorised operations over flat buffers (minitensor.flat_params)
    kernel_threads     the flat AdamW update and attention's stacks of small products
                       split over a small thread pool (minitensor.kernel_threads)
    single_thread_small_gemms   stacks of small matrix products (attention's heads) on
                       one BLAS thread (kernel_threads.one_blas_thread)
    free_unsaved_activations    a node holds its inputs' places in the graph, not their
                       values: an activation no backward saved is freed during forward
                       (autograd.Place)
    gelu_saves_derivative       GELU keeps dy/dx for backward instead of x and tanh u
                       (unary_ops.Gelu)

Turn them off for a whole run with the environment variable MINITENSOR_PLAIN (all of
them: MINITENSOR_PLAIN=1, or some: MINITENSOR_PLAIN=flat_optimizer,kernel_threads),
or for a block of code:

    with speed.disabled("flat_optimizer"):
        ...
"""
import contextlib
import os

SWITCHES = ("flat_optimizer", "kernel_threads", "single_thread_small_gemms", "free_unsaved_activations",
            "gelu_saves_derivative")


def _from_environment():
    plain = os.environ.get("MINITENSOR_PLAIN", "").strip()
    if plain in ("", "0"):
        return dict.fromkeys(SWITCHES, True)
    off = SWITCHES if plain == "1" else [name.strip() for name in plain.split(",")]
    unknown = sorted(set(off) - set(SWITCHES))
    if unknown:
        raise ValueError(f"MINITENSOR_PLAIN={plain}: unknown switch(es) {unknown}; the switches are {list(SWITCHES)}")
    return {name: name not in off for name in SWITCHES}


_on = _from_environment()


def enabled(name):
    """True when optimisation `name` is on."""
    return _on[name]


@contextlib.contextmanager
def disabled(*names):
    """Run the block with the named optimisations off (all of them when none are named).
    The switches are process-wide: every thread sees them."""
    names = names or SWITCHES
    unknown = sorted(set(names) - set(SWITCHES))
    if unknown:
        raise ValueError(f"speed.disabled: unknown switch(es) {unknown}; the switches are {list(SWITCHES)}")
    before = dict(_on)
    _on.update(dict.fromkeys(names, False))
    try:
        yield
    finally:
        _on.update(before)
