"""The pipeline executor on the threads backend: every schedule equals one device."""
import json
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitensor as mt
import parallel
from minitensor.models.gpt import GPT, GPTConfig
from parallel import run_threads
from parallel.pipeline import Pipeline, bubble_theory, split_gpt

sys.path.insert(0, str(Path(__file__).parents[1] / "mpi_scripts"))
from pp_common import check_against_single, expected_peaks, make_batches, run_pipeline, run_single  # noqa: E402
from strategies import seeds  # noqa: E402

STEPS = 3


@st.composite
def pipeline_layouts(draw):
    """(schedule, p, m, v, micro-batch size, GPT config, balance or None)."""
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev"]))
    p = draw(st.integers(1, 4))
    v = 2 if schedule == "dualpipev" else draw(st.integers(1, 2)) if schedule == "interleaved" and p > 1 else 1
    if schedule == "dualpipev":  # at least 2p micro-batches
        m = draw(st.integers(2 * p, 2 * p + 2))
    else:
        m = p * draw(st.integers(1, 8 // p)) if v > 1 else draw(st.integers(1, 8))
    n_layer = draw(st.integers(p * v, p * v + 2))
    n_head = draw(st.sampled_from([1, 2]))
    cfg = GPTConfig(vocab_size=draw(st.integers(5, 17)), block_size=draw(st.integers(2, 6)), n_layer=n_layer,
                    n_head=n_head, d_model=n_head * draw(st.sampled_from([4, 6])))
    cuts = sorted(draw(st.sets(st.integers(1, n_layer - 1), min_size=p * v - 1, max_size=p * v - 1))
                  if n_layer > 1 else [])
    balance = draw(st.sampled_from([None, list(np.diff([0, *cuts, n_layer]))]))
    return schedule, p, m, v, draw(st.integers(1, 2)), cfg, balance


@given(layout=pipeline_layouts(), recompute=st.booleans(), seed=seeds)
def test_loss_gradients_and_adamw_steps_equal_one_device(layout, recompute, seed):
    schedule, p, m, v, micro, cfg, balance = layout
    batches = make_batches(seed, cfg, m * micro, STEPS)
    runs = run_threads(p, lambda: run_pipeline(parallel.world(), cfg, seed, batches, m, schedule, v, balance,
                                               recompute), timeout=60)
    ref = run_single(cfg, seed, batches)
    peaks = expected_peaks(schedule, p, m, v)
    for rank, (history, rank_peaks) in enumerate(runs):
        check_against_single(history, ref)
        assert rank_peaks == [peaks[rank]] * STEPS


@pytest.mark.parametrize("p, m", [(2, 4), (3, 5), (4, 8)])
def test_gpipe_stores_m_micro_batches_1f1b_at_most_p_and_recomputation_stores_less(p, m):
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=p, n_head=1, d_model=8)
    idx, targets = make_batches(0, cfg, m, 1)[0]

    def peaks(schedule, recompute):
        pipe = Pipeline.from_gpt(GPT(cfg).double(), parallel.world(), m, schedule, recompute=recompute)
        pipe.train_step(idx, targets)
        return pipe.peak_activations, pipe.peak_activation_bytes

    for rank, ((gpipe, _), (ofob, ofob_bytes), (ofob_ck, ofob_ck_bytes)) in enumerate(run_threads(
            p, lambda: [peaks("gpipe", False), peaks("1f1b", False), peaks("1f1b", True)])):
        assert gpipe == m
        assert ofob == min(p - rank, m) <= p and ofob_ck == ofob
        assert ofob_ck_bytes < ofob_bytes


class SentValuesWatch:
    """The pipeline group with one addition: every array `send` is given is watched through a
    weak reference, and at each later call on the group (send, recv, barrier, broadcast) none
    of them may be alive any more: once sent, an activation's values must be freed (only the
    graph behind it is needed until its backward). The real collectives still run."""

    def __init__(self, group):
        self.group, self.sent, self.kept = group, [], []

    def __getattr__(self, name):
        return getattr(self.group, name)

    def check_sent_values_freed(self, call):
        self.kept += [(call, shape) for ref, shape in self.sent if ref() is not None]
        self.sent = []

    def send(self, arr, dst, tag=0):
        self.check_sent_values_freed("send")
        self.group.send(arr, dst, tag)
        self.sent.append((weakref.ref(arr), arr.shape))

    def recv(self, arr, src, tag=0):
        self.check_sent_values_freed("recv")
        return self.group.recv(arr, src, tag)

    def barrier(self):
        self.check_sent_values_freed("barrier")
        return self.group.barrier()

    def broadcast(self, arr, root=0):
        self.check_sent_values_freed("broadcast")
        return self.group.broadcast(arr, root)


@pytest.mark.parametrize("schedule, p, m, chunks", [("gpipe", 2, 3, 1), ("1f1b", 3, 4, 1), ("interleaved", 2, 2, 2)])
def test_a_stage_frees_the_values_of_every_output_it_has_sent(schedule, p, m, chunks):
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=p * chunks, n_head=1, d_model=8)
    idx, targets = make_batches(0, cfg, m, 1)[0]

    def run():
        group = SentValuesWatch(parallel.world())
        pipe = Pipeline.from_gpt(GPT(cfg).double(), group, m, schedule, chunks=chunks)
        pipe.train_step(idx, targets)
        return group.group.stats()["send"]["calls"], group.kept

    for rank, (sends, kept) in enumerate(run_threads(p, run, timeout=30)):
        stages = [rank + chunk * p for chunk in range(chunks)]
        # every stage but the last sends m outputs, every stage but the first m input gradients
        assert sends == m * sum((s < p * chunks - 1) + (s > 0) for s in stages)
        assert kept == [], f"rank {rank} still holds the values of sent arrays at these calls: {kept}"


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_zero_bubble_counts_a_micro_batch_until_its_w(p, m):
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=p, n_head=1, d_model=8)
    idx, targets = make_batches(0, cfg, m, 1)[0]

    def peaks(schedule):
        pipe = Pipeline.from_gpt(GPT(cfg).double(), parallel.world(), m, schedule)
        pipe.train_step(idx, targets)
        kinds = [e.kind for e in pipe.events]
        return pipe.peak_activations, pipe.peak_activation_bytes, kinds.count("backward_weight")

    for rank, (ofob, h1, h2) in enumerate(run_threads(p, lambda: [peaks(s) for s in ("1f1b", "zb-h1", "zb-h2")])):
        assert h1[0] == min(p, m) and h1[2] == h2[2] == m and ofob[2] == 0
        # Between B and W a micro-batch keeps only the linear layers' inputs and output
        # gradients; in this tiny model those are about its whole activations, so zb-h1's
        # rank 0 (B then W at once) peaks near 1F1B in bytes and zb-h2 (2p-1 in flight) above.
        if rank == 0:
            assert h1[0] == ofob[0] and h2[0] == min(2 * p - 1, m) and h2[1] > ofob[1]


def test_timeline_gathers_every_rank_and_reports_the_bubble(tmp_path):
    p, m = 2, 4
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=2, n_head=1, d_model=8)
    idx, targets = make_batches(0, cfg, m, 1)[0]

    def run():
        pipe = Pipeline.from_gpt(GPT(cfg), parallel.world(), m, "gpipe")
        pipe.train_step(idx, targets)
        return pipe.timeline(), pipe.bubble()

    (timeline, (measured, theory)), _ = run_threads(p, run)
    computes = [(e.rank, e.kind, e.microbatch) for e in timeline.compute]
    assert sorted(computes) == sorted((r, k, mb) for r in range(p) for k in ("forward", "backward")
                                      for mb in range(m))
    assert theory == bubble_theory(p, m) == 1 / 5
    # What the timings cannot change: each rank computes in its schedule's order, one thing at a
    # time; rank 1 idles at least through rank 0's F0 and rank 0 through rank 1's last backward.
    # (Each rank's clock starts as it leaves the step's barrier, so times of different ranks are
    # not compared with each other: the threads leave it a fraction of a millisecond apart.)
    def span(rank, kind, mb):
        (event,) = [e for e in timeline.compute if (e.rank, e.kind, e.microbatch) == (rank, kind, mb)]
        return event.start, event.end
    for rank in range(p):
        mine = [e for e in timeline.compute if e.rank == rank]
        assert [(e.kind, e.microbatch) for e in mine] == [("forward", mb) for mb in range(m)] + [
            ("backward", mb) for mb in range(m)]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    forced_idle = (span(0, "forward", 0)[1] - span(0, "forward", 0)[0]) + (
        span(1, "backward", m - 1)[1] - span(1, "backward", m - 1)[0])
    assert measured >= forced_idle / (p * timeline.makespan) - 1e-12
    assert timeline.render().startswith("rank 0 | F0")
    timeline.save_chrome_trace(tmp_path / "trace.json")
    assert len(json.loads((tmp_path / "trace.json").read_text())["traceEvents"]) >= 4 * p * m


def test_full_state_dict_is_the_dense_state_dict_on_every_rank():
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=3, n_head=1, d_model=4)
    mt.manual_seed(3)
    dense = GPT(cfg).state_dict()

    def run():
        mt.manual_seed(3)
        return Pipeline.from_gpt(GPT(cfg), parallel.world(), 1, balance=[2, 1]).full_state_dict()

    for state in run_threads(2, run):
        assert list(state) == list(dense)
        for name in dense:
            np.testing.assert_array_equal(state[name], dense[name])


def test_bad_batches_and_stages_name_the_values():
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=2, n_head=1, d_model=4)
    idx = np.zeros((6, 4), dtype=np.int64)
    pipe = Pipeline.from_gpt(GPT(cfg), parallel.world(), 4)
    with pytest.raises(ValueError, match="batch size 6 is not divisible by microbatches=4"):
        pipe.train_step(idx, idx)
    with pytest.raises(ValueError, match=r"same shape \(B, T\), got \(6, 4\) and \(6, 3\)"):
        pipe.train_step(idx, idx[:, :3])
    stages = split_gpt(GPT(cfg), 2)
    with pytest.raises(ValueError, match="needs stage 0 of 1 as chunk 0, got stage 1 of 2"):
        Pipeline(stages[1], parallel.world(), 2)
    with pytest.raises(ValueError, match="n_layer=2 blocks into 4 pipeline stages"):
        run_threads(2, lambda: Pipeline.from_gpt(GPT(cfg), parallel.world(), 2, "interleaved", chunks=2))
