"""Stages of unequal size on a GPU cluster: the balanced split is the optimum, the slowest stage paces
the step, the ends are costed on their stages, and the issue's 70 layers on 12 stages are planned."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitensor.models.gpt import GPTConfig
from parallel.pipeline.partition import balance_by_cost
from parallel.plan import load_profile
from parallel.plan.__main__ import main
from parallel.plan.cluster import embed_seconds, figures, head_seconds, step
from parallel.plan.stage_split import balanced_split, stage_seconds, stage_split

A100 = load_profile("a100-80gb")
SEVENTY = ["--n-layer", "70", "--d-model", "8192", "--n-head", "64", "--vocab", "51200", "--seq", "2048",
           "--batch", "512", "--devices", "384", "--device", "a100-80gb", "--layout"]


@given(n=st.integers(1, 24), data=st.data(), block=st.sampled_from([1.0, 0.7, 2.5]),
       embed=st.sampled_from([0.0, 0.3, 1.2, 5.0]), head=st.sampled_from([0.0, 0.5, 2.0, 7.3]))
def test_the_balanced_split_is_as_fast_as_the_dynamic_programme(n, data, block, embed, head):
    pp = data.draw(st.integers(1, n))
    split = balanced_split(n, pp, block, embed, head)
    assert len(split) == pp and sum(split) == n and min(split) >= 1
    best = balance_by_cost([block] * n, pp, first_extra=embed, last_extra=head)  # partition's O(p·n²) search
    assert max(stage_seconds(split, block, embed, head, 0.0)) == pytest.approx(
        max(stage_seconds(best, block, embed, head, 0.0)), abs=1e-12)


def test_the_even_split_gives_the_first_stages_one_more_block():
    assert stage_split(70, 12, "even", 1.0, 0.0, 0.0) == [6] * 10 + [5] * 2
    with pytest.raises(ValueError, match="split='megatron' is not one of"):
        stage_split(70, 12, "megatron", 1.0, 0.0, 0.0)


def test_the_slowest_stage_paces_the_step_with_the_ends_on_their_stages():
    config = GPTConfig(vocab_size=51200, block_size=2048, n_layer=70, n_head=64, d_model=8192)
    even, balanced = (step(config, A100, 512, 4, 12, 8, 1, split=cut) for cut in ("even", "balanced"))
    assert even.split == [6] * 10 + [5] * 2 and sum(balanced.split) == 70
    gpu = figures(A100)
    head, embed = head_seconds(config, gpu, 4, 1), embed_seconds(config, gpu, 4, 1)
    assert head > embed > 0
    assert balanced.split[-1] < max(balanced.split)  # the head's stage gives up blocks
    # bubble = (p − 1)·t_stage with t_stage the slowest stage's time: the balanced split's is no larger
    assert balanced.seconds["bubble"] <= even.seconds["bubble"]
    assert balanced.seconds["step"] <= even.seconds["step"]


def test_the_issues_command_plans_70_layers_on_12_stages_and_prints_the_split(capsys):
    assert main([*SEVENTY, "tp=4,pp=12,dp=8"]) == 0
    out = capsys.readouterr().out
    assert "blocks per stage (uneven): [" in out and "fits" in out
    assert main([*SEVENTY, "tp=4,pp=12,dp=8,split=even", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["split"] == [6] * 10 + [5] * 2


def test_the_ends_split_takes_a_block_from_the_first_and_last_stage():
    from parallel.plan.stage_split import stage_split
    assert stage_split(70, 12, "ends", 1.0, 0.0, 0.0) == [5] + [6] * 10 + [5]
    assert stage_split(126, 16, "ends", 1.0, 0.0, 0.0) == [7] + [8] * 14 + [7]     # Llama 3 405B's
    assert stage_split(9, 4, "ends", 1.0, 0.0, 0.0) == [1, 4, 3, 1]
    assert stage_split(5, 4, "ends", 1.0, 0.0, 0.0) == [2, 1, 1, 1]               # too few blocks: even


def test_the_small_model_search_tries_uneven_splits_and_prints_them(capsys):
    """A vocabulary of 8000 makes the head cost more than two blocks of d = 128: on 4 stages the
    searched splits beat the even one, and the table names the split (a `parallel.train --balance`)."""
    from parallel.plan import GPTConfig, Layout, estimate, plan
    from parallel.plan.__main__ import main as plan_main
    from parallel.plan.search import stage_splits
    config = GPTConfig(vocab_size=8000, block_size=64, n_layer=8, n_head=4, d_model=128)
    layout = Layout(pp=4, micro_batches=8)
    times = {tuple(b or ()): estimate(config, layout, 16, "laptop-cpu", balance=b).time["total"]
             for b in stage_splits(config, layout, 16)}
    assert set(times) == {(), (1, 3, 3, 1), (5, 1, 1, 1)} and min(times, key=times.get) != ()
    best = [est for est in plan(config, 4, 16, "laptop-cpu", splits=True).ranked if est.layout.pp == 4][0]
    assert best.balance == [1, 3, 3, 1]                     # tied with [5, 1, 1, 1] in time, less memory
    assert all(est.balance is None for est in plan(config, 4, 16, "laptop-cpu").ranked)
    plan_main(["--n-layer", "8", "--d-model", "128", "--n-head", "4", "--vocab", "8000", "--seq", "64", "--batch", "16",
               "--devices", "4", "--try-splits", "--top", "60"])
    assert "  split=6-2  " in capsys.readouterr().out      # dp·tp·pp2: the head's stage holds 2 blocks
