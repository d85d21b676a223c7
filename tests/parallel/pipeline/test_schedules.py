"""Schedule generators: exact lists for small cases, structure for many."""
import pytest
from hypothesis import given
from strategies import pipeline_shapes

from parallel.pipeline import Action, get_schedule, gpipe, interleaved, one_f_one_b
from parallel.pipeline.schedules import prerequisites


def F(mb, c=0):
    return Action("forward", mb, c)


def B(mb, c=0):
    return Action("backward", mb, c)


def send_fwd(mb, peer, c=0):
    return Action("send_fwd", mb, c, peer)


def recv_fwd(mb, peer, c=0):
    return Action("recv_fwd", mb, c, peer)


def send_bwd(mb, peer, c=0):
    return Action("send_bwd", mb, c, peer)


def recv_bwd(mb, peer, c=0):
    return Action("recv_bwd", mb, c, peer)


def computes(actions):
    return [(a.kind[0].upper(), a.microbatch, a.chunk) for a in actions if a.is_compute]


def test_gpipe_two_ranks_two_microbatches():
    assert gpipe(2, 2) == [
        [F(0), send_fwd(0, 1), F(1), send_fwd(1, 1),
         recv_bwd(0, 1), B(0), recv_bwd(1, 1), B(1)],
        [recv_fwd(0, 0), F(0), recv_fwd(1, 0), F(1),
         B(0), send_bwd(0, 0), B(1), send_bwd(1, 0)],
    ]


@pytest.mark.parametrize("p, m", [(2, 4), (3, 5), (4, 2)])
def test_gpipe_runs_every_forward_before_any_backward(p, m):
    """More micro-batches than ranks too: there a warm-up of p − 1 (1F1B's) would differ."""
    for actions in gpipe(p, m):
        assert [(a.kind, a.microbatch) for a in actions if a.kind in ("forward", "backward")] == \
            [("forward", mb) for mb in range(m)] + [("backward", mb) for mb in range(m)]


def test_a_compute_waits_for_exactly_the_work_it_reads():
    """A forward reads the stage before's activation; a backward (or B) its own forward and, but on
    the last stage, the stage after's input gradient; a W its own B."""
    last = 2
    assert prerequisites("forward", 1, 0, last) == []
    assert prerequisites("forward", 1, 2, last) == [("forward", 1, 1)]
    for kind in ("backward", "backward_input"):
        assert sorted(prerequisites(kind, 1, 2, last)) == [("forward", 1, 2)]
        assert sorted(prerequisites(kind, 1, 1, last)) == [("backward_input", 1, 2), ("forward", 1, 1)]
    assert prerequisites("backward_weight", 0, 1, last) == [("backward_input", 0, 1)]


def test_1f1b_two_ranks_three_microbatches():
    # Steady state on rank 0 after F2: it takes gradient 1 before sending
    # activation 2, exactly when rank 1 sends gradient 1 before taking
    # activation 2 -- the order that avoids the rendezvous deadlock.
    assert one_f_one_b(2, 3) == [
        [F(0), send_fwd(0, 1), F(1), send_fwd(1, 1), recv_bwd(0, 1), B(0),
         F(2), recv_bwd(1, 1), send_fwd(2, 1), B(1), recv_bwd(2, 1), B(2)],
        [recv_fwd(0, 0), F(0), recv_fwd(1, 0), B(0), send_bwd(0, 0), F(1),
         B(1), send_bwd(1, 0), recv_fwd(2, 0), F(2), B(2), send_bwd(2, 0)],
    ]


def test_interleaved_two_ranks_two_microbatches_two_chunks():
    # Stages: rank 0 holds 0 and 2, rank 1 holds 1 and 3; stage 1 -> 2 wraps to rank 0.
    assert interleaved(2, 2, 2) == [
        [F(0, 0), send_fwd(0, 1, 0), F(1, 0), send_fwd(1, 1, 0),
         recv_fwd(0, 1, 1), F(0, 1), send_fwd(0, 1, 1),
         recv_fwd(1, 1, 1), F(1, 1), send_fwd(1, 1, 1),
         recv_bwd(0, 1, 1), B(0, 1), send_bwd(0, 1, 1),
         recv_bwd(1, 1, 1), B(1, 1), send_bwd(1, 1, 1),
         recv_bwd(0, 1, 0), B(0, 0), recv_bwd(1, 1, 0), B(1, 0)],
        [recv_fwd(0, 0, 0), F(0, 0), recv_fwd(1, 0, 0), send_fwd(0, 0, 0), F(1, 0),
         recv_fwd(0, 0, 1), send_fwd(1, 0, 0), F(0, 1), recv_fwd(1, 0, 1),
         B(0, 1), send_bwd(0, 0, 1), F(1, 1), B(1, 1), recv_bwd(0, 0, 0),
         send_bwd(1, 0, 1), B(0, 0), recv_bwd(1, 0, 0), send_bwd(0, 0, 0),
         B(1, 0), send_bwd(1, 0, 0)],
    ]


def test_interleaved_compute_order_follows_megatron():
    # p=2, m=4, v=2: rank 1 warms up with (p-r-1)*2 + (v-1)*p = 2 forward units,
    # units go in groups of p micro-batches per chunk, backwards visit chunks in reverse.
    assert computes(interleaved(2, 4, 2)[1]) == [
        ("F", 0, 0), ("F", 1, 0),
        ("F", 0, 1), ("B", 0, 1), ("F", 1, 1), ("B", 1, 1),
        ("F", 2, 0), ("B", 0, 0), ("F", 3, 0), ("B", 1, 0),
        ("F", 2, 1), ("B", 2, 1), ("F", 3, 1), ("B", 3, 1),
        ("B", 2, 0), ("B", 3, 0)]


@given(pipeline_shapes(schedule="1f1b"))
def test_1f1b_warmup_steady_cooldown(shape):
    _, p, m, _ = shape
    for r, actions in enumerate(one_f_one_b(p, m)):
        warmup = min(p - r - 1, m)
        order = computes(actions)
        assert order[:warmup] == [("F", mb, 0) for mb in range(warmup)]
        steady = [("F", mb + warmup, 0) if i % 2 == 0 else ("B", mb, 0)
                  for mb in range(m - warmup) for i in range(2)]
        assert order[warmup:warmup + len(steady)] == steady
        assert order[warmup + len(steady):] == [("B", mb, 0) for mb in range(m - warmup, m)]


@given(pipeline_shapes(schedule="1f1b"))
def test_interleaved_with_one_chunk_is_1f1b(shape):
    _, p, m, _ = shape
    assert interleaved(p, m, 1) == one_f_one_b(p, m)


@given(pipeline_shapes())
def test_backwards_of_a_chunk_run_in_microbatch_order(shape):
    # Same gradient-accumulation order in every schedule.
    name, p, m, v = shape
    for actions in get_schedule(name, p, m, v):
        for c in range(v):
            assert [a.microbatch for a in actions if a.kind == "backward" and a.chunk == c] \
                == list(range(m))


def test_single_rank_has_no_communication():
    assert gpipe(1, 3) == [[F(0), F(1), F(2), B(0), B(1), B(2)]]
    assert one_f_one_b(1, 3) == [[F(0), B(0), F(1), B(1), F(2), B(2)]]


def test_action_reads_like_prose():
    assert str(send_fwd(3, 1, 0)) == "send_fwd(mb=3, chunk=0) to rank 1"
    assert str(recv_bwd(2, 0, 1)) == "recv_bwd(mb=2, chunk=1) from rank 0"
    assert str(B(4)) == "backward(mb=4, chunk=0)"


@pytest.mark.parametrize("call, words", [
    (lambda: interleaved(4, 6, 2), ["m=6", "p=4"]),
    (lambda: interleaved(1, 4, 2), ["p >= 2", "v=2"]),
    (lambda: get_schedule("zero-bubble", 2, 4), ["'zero-bubble'"]),
    (lambda: get_schedule("gpipe", 2, 4, 2), ["'gpipe'", "v=2"]),
    (lambda: one_f_one_b(0, 4), ["p", "0"]),
    (lambda: gpipe(2, 1.5), ["m", "1.5"]),
])
def test_bad_sizes_name_the_values(call, words):
    with pytest.raises(ValueError) as error:
        call()
    for word in words:
        assert word in str(error.value)
