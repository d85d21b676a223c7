"""How the benchmarks time their calls. Every benchmark (`python -m minitensor.bench`,
`python -m parallel.bench NAME`) times with the same few functions:

    timed_calls(call, repeats, warmup=1, before=tuple)   seconds of each timed call(*before())
    median_seconds(call, repeats, warmup=1, before=tuple) their median
    timed_turns(calls, repeats, warmup=1)                 several calls taking turns, call by call
    quartiles(values)                                     the middle half: a printed spread

(on the BLAS threads minitensor.bench_cli sets: one unless asked). `python -m minitensor.bench`
and its `--graph` view (bench_graph.py) add what a GPT step needs: the GPT configs, a fixed
random batch, one AdamW step of a model (or of its traced graph), timed steps alternating
with a partner's (step by step) and another library's (in blocks), the seconds inside
matrix products, the paired ratios, the peak memory of a step.
"""
import ctypes
import ctypes.util
import statistics
import time
from contextlib import contextmanager

import numpy as np

from minitensor.models.gpt import GPTConfig
from minitensor.nn import functional as F
from minitensor.ops import MatMul
from minitensor.optim import AdamW

CONFIGS = {
    "small": (GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, d_model=128), 16),
    "medium": (GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=8, d_model=512), 8),
    # the small GPT's ops at a size where their arithmetic vanishes: what is left of a step
    # is its fixed cost (Python, graph nodes, numpy's per-call overhead). Not run by default.
    "tiny": (GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=4, d_model=8), 1),
}
DEFAULT_CONFIGS = ("small", "medium")


def _status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def peak_step_bytes(step):
    """The largest resident-memory increase over one call of `step`, or None without /proc.

    Freed memory goes back to the OS first (malloc_trim), so the step's arrays must be
    faulted in again and count, whatever the allocator kept from earlier steps."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
        before = _status_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset VmHWM (the peak) to the current resident size
        step()
        return 1024 * (_status_kib("VmHWM") - before)
    except (OSError, AttributeError, StopIteration):
        return None


@contextmanager
def matmul_timer():
    """Wrap the forward and backward of the matrix-product Functions with a clock.

    Yields a one-element list holding the seconds spent inside them so far. The
    wrappers exist only inside the `with` block, so an ordinary run pays nothing.
    """
    total = [0.0]
    originals = {}

    def timed(method):
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start
        return wrapper

    for cls in (MatMul, F.Linear):
        for name in ("forward", "backward"):
            originals[cls, name] = cls.__dict__[name]
            setattr(cls, name, timed(originals[cls, name]))
    try:
        yield total
    finally:
        for (cls, name), method in originals.items():
            setattr(cls, name, method)


def random_batch(config, batch, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, config.block_size)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def training_step(model, forward, idx, targets):
    """A function that runs one AdamW step of `model`'s parameters, the loss from
    `forward(idx, targets) -> (logits, loss)` (the model itself, or its traced graph)."""
    optimizer = AdamW(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        _, loss = forward(idx, targets)
        loss.backward()
        optimizer.step()

    return step


def time_steps(step, steps, warmup, partner=None, others=(), rounds=4, probe=None):
    """Seconds per step of `step` and its seconds inside matmuls, of `partner` (None if absent)
    and of each of `others` (None for an absent one), each a list of rounds (a list of steps
    each), and the seconds of `probe()` called once per round (or []).

    `partner` shares `step`'s BLAS threads (the numpy limit; the other graph): the two
    alternate step by step, each first in turn, so the two steps of a pair saw the same
    machine and `pair_ratios` compares them (this machine's speed swings by 1.6× within
    minutes, and between blocks of steps that swing was the ratio's noise). `others` (torch,
    whose OpenMP threads spin on after each call) run in blocks of steps/rounds steps after
    the round: switching every step would make each wait for the other's spinning threads.
    The blocks of a round, back to back, feed `paired_ratio`. Each block and round starts
    after `warmup` untimed steps.
    """
    times, matmul, partner_times, probes = [], [], [], []
    other_times = [[] if other else None for other in others]
    for r in range(rounds):
        block = steps // rounds + (r < steps % rounds)
        for _ in range(warmup):
            step()
            if partner:
                partner()
        times.append([])
        matmul.append([])
        partner_times.append([])
        for i in range(block):
            if partner and i % 2:
                partner_times[-1].append(seconds_of(partner))
            with matmul_timer() as inside:
                times[-1].append(seconds_of(step))
            matmul[-1].append(inside[0])
            if partner and not i % 2:
                partner_times[-1].append(seconds_of(partner))
        if probe:  # here, not after torch's block: its OpenMP threads spin on after it, sharing the cores
            probes.append(probe())
        for other, rounds_of_other in zip(others, other_times):
            if other:
                rounds_of_other.append(timed_calls(other, block, warmup))
    return times, matmul, partner_times if partner else None, other_times, probes


def seconds_of(call, *args):
    start = time.perf_counter()
    call(*args)
    return time.perf_counter() - start


def timed_calls(call, repeats, warmup=1, before=tuple):
    """Seconds of each of `repeats` calls of call(*before()), after `warmup` untimed ones.

    before() runs untimed before every call, warm-up included: it returns the call's arguments
    (a fresh batch) and may line ranks up (a barrier) or reset counters, so only the call is timed."""
    for _ in range(warmup):
        call(*before())
    return [seconds_of(call, *before()) for _ in range(repeats)]


def median_seconds(call, repeats, warmup=1, before=tuple):
    """The median of timed_calls: what a benchmark prints as "median of N"."""
    return statistics.median(timed_calls(call, repeats, warmup, before))


def timed_turns(calls, repeats, warmup=1):
    """Seconds of each timed call of each of `calls` (a list per call): the calls take turns,
    each once per turn, for `warmup` untimed turns and `repeats` timed ones, so a machine whose
    load changes slows them alike, not whichever ran last."""
    for _ in range(warmup):
        for call in calls:
            call()
    turns = [[seconds_of(call) for call in calls] for _ in range(repeats)]
    return [list(seconds) for seconds in zip(*turns)]


def quartiles(values):
    """(25th, 75th percentile): the middle half of `values`, the spread a benchmark prints."""
    return tuple(float(q) for q in np.percentile(values, [25, 75]))


def every_step(rounds):
    """The steps of all rounds, in one list."""
    return [seconds for steps in rounds for seconds in steps]


def paired_ratio(rounds, other_rounds):
    """Median over rounds of (this round's median step / the other's median step in the same
    round). The two blocks of a round ran back to back, so a change of the machine's own
    speed between rounds (±10% over minutes here) divides out, where a ratio of the two
    overall medians would keep it."""
    return statistics.median(statistics.median(mine) / statistics.median(theirs)
                             for mine, theirs in zip(rounds, other_rounds) if mine and theirs)


def pair_ratios(rounds, partner_rounds):
    """This step / the partner's step, for each pair of steps run one after the other
    (`time_steps`): their median is the ratio, their quartiles its spread."""
    return [mine / theirs for mine, theirs in zip(every_step(rounds), every_step(partner_rounds))]


def mib(nbytes):
    return "-" if nbytes is None else f"{nbytes / 2**20:.0f}"
