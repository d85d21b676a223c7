"""The tied embedding across pipeline stages (parallel.pipeline.tied): BERT's token embedding
is held by the first stage (lookup) and the last (MLM head); their gradients are summed."""
import sys
from pathlib import Path

import numpy as np
import pytest

import parallel
from minitensor.models.bert import BertConfig
from parallel import HybridGPT, Mesh, Pipeline, run_threads
from parallel.pipeline.tied import TiedGradients
from parallel.tensor_parallel.sharding import padded_size

sys.path.insert(0, str(Path(__file__).parents[1] / "mpi_scripts"))
from helpers import assert_close  # noqa: E402
from hybrid_common import check_against_single, make_batches, make_model, run_hybrid, run_single  # noqa: E402

CONFIG = BertConfig(vocab_size=9, block_size=8, n_layer=3, n_head=2, d_model=8, sep_id=1)


def bert_step(dp, tp, pp):
    """One step of the layout; per rank: (pp rank, the tied copies' gradients as dense arrays,
    the embedding group's counted all-reduce)."""
    batches = make_batches(0, CONFIG, 4, 5, 1)

    def rank_fn():
        model = HybridGPT(make_model(CONFIG, 0), Mesh(dp, tp, pp), microbatches=2)
        model.configure_optimizer()
        model.reset_communication_stats()
        model.train_step(*batches[0])
        model.finish_grad_sync()
        copies = [p.grad.copy() for p in model.tied.copies]
        return model.mesh.pp_rank, model.mesh.tp_rank, copies, model.communication_stats().get(("embedding", "all_reduce"))

    return run_threads(dp * tp * pp, rank_fn, timeout=60)


def dense_embedding_grad():
    model = make_model(CONFIG, 0)
    model(*make_batches(0, CONFIG, 4, 5, 1)[0])[1].backward()
    return model.tok_emb.weight.grad


def test_both_ends_hold_the_summed_gradient_and_the_middle_takes_no_part():
    tp, pp = 2, 3
    rows = padded_size(CONFIG.vocab_size, tp) // tp  # each tp rank's vocabulary rows of the (padded) table
    dense = np.pad(dense_embedding_grad(), ((0, rows * tp - CONFIG.vocab_size), (0, 0)))
    for pp_rank, tp_rank, copies, stats in bert_step(1, tp, pp):
        if pp_rank == 1:
            assert copies == [] and stats is None  # a middle stage: nothing tied, nothing sent
            continue
        (grad,) = copies  # on both ends: the lookup's part plus the head's, as one device has it
        assert_close(grad, dense[tp_rank * rows:(tp_rank + 1) * rows], f"pp rank {pp_rank}, tp rank {tp_rank}")
        assert stats == {"calls": 1, "elements": rows * CONFIG.d_model, "bytes": rows * CONFIG.d_model * 8}


def test_without_the_sum_the_pipeline_would_not_equal_one_device(monkeypatch):
    # The embedding's gradient would miss the head's part (first stage) or the lookup's (last).
    monkeypatch.setattr(TiedGradients, "finish", lambda self: None)
    spec = dict(dp=1, tp=1, pp=2, microbatches=2, schedule="1f1b", chunks=1, sequence_parallel=False,
                recompute_activations=False, zero=False)
    batches = make_batches(2, CONFIG, 2, 5, 1)
    history = run_threads(2, run_hybrid, spec, CONFIG, 2, batches, 1, timeout=60)[0]
    with pytest.raises(AssertionError, match="tok_emb.weight"):
        check_against_single(history, run_single(CONFIG, 2, batches, 1))



def test_a_bare_pipeline_of_a_tied_model_is_a_clear_error():
    # Pipeline alone has no embedding group to sum the copies over: HybridGPT has.
    def build():
        Pipeline.from_gpt(make_model(CONFIG, 0), parallel.world(), microbatches=2)

    with pytest.raises(ValueError, match=r"BERT ties parameters .* use HybridGPT\(model, Mesh\(1, 1, 2\)\)"):
        run_threads(2, build, timeout=30)
