"""Chapter 17 (smaller models): the scripts run and print the evidence the README talks about:
BERT's masking shares and its one-device equality through the parallel layers (threads and
mpiexec), the pruning table, the distillation comparison (tiny runs: format and invariants;
the README's numbers come from the full runs)."""
import re

import pytest
from chapter_runner import number_after, run_script

CH17 = "tutorials/17_smaller_models/"


@pytest.mark.parametrize("how, ranks", [({"threads": 8}, 8), pytest.param({"mpi_ranks": 4}, 4, marks=pytest.mark.deep)], ids=["threads8", "mpi4"])
def test_bert_masking_shares_and_the_3d_step_equal_to_one_device(how, ranks):
    args = [] if ranks == 8 else ["--dp", "1"]
    out = run_script(CH17 + "bert_masking.py", *args, timeout=300, **how)
    assert abs(number_after("[MASK]", out) - 0.8) < 0.01
    assert abs(number_after("random", out) - 0.09) < 0.01       # 10%, of which 1 in 10 redraws the original
    assert abs(number_after("unchanged", out) - 0.11) < 0.01
    assert f"ranks that drew the same masks from (seed, step): {ranks} of {ranks}" in out
    assert number_after("relative loss difference to one device:", out) <= 1e-12
    assert number_after("largest relative gradient difference to one device:", out) <= 1e-9
    assert number_after("tied embedding gradient, largest difference to one device:", out) <= 1e-12
    assert re.search(r"embedding group on rank 0: 1 all-reduce of 112 elements", out)  # (14 / 2) x 16


def table(out):
    """{model: (parameters, sparsity, pruned, fine-tuned)} of the pruning table."""
    rows = re.findall(r"^  (\S.*?)\s+([\d,]+)\s+(\d\.\d{4})\s+(\d\.\d{3})\s+(\d\.\d{3})$", out, re.M)
    return {name: (int(p.replace(",", "")), float(s), float(a), float(b)) for name, p, s, a, b in rows}


def test_prune_curve_reaches_each_sparsity_and_structured_pruning_shrinks_the_model():
    out = run_script(CH17 + "prune_curve.py", "--teacher-steps", "20", "--finetune-steps", "3", "--problems", "20",
                     "--sparsity", "0.5", "0.9", timeout=600)
    rows = table(out)
    assert list(rows) == ["dense (control)", "magnitude 50%", "magnitude 90%", "structured: 1/2 heads + neurons"]
    dense = rows["dense (control)"][0]
    assert rows["magnitude 50%"][1] == 0.5 and rows["magnitude 90%"][1] == 0.9
    assert dense > rows["magnitude 50%"][0] > rows["magnitude 90%"][0]
    assert rows["structured: 1/2 heads + neurons"][0] < 0.6 * dense
    assert len(re.findall(r"^  magnitude 90%: step \d+  loss \d\.\d{4}$", out, re.M)) == 3  # progress lines


def test_distill_gain_prints_both_students_per_seed_and_the_medians():
    out = run_script(CH17 + "distill_gain.py", "--teacher-steps", "20", "--steps", "3", "--problems", "20",
                     "--seeds", "0", "1", timeout=600)
    assert number_after("parameters =", out) <= 0.25  # the student is under a quarter of the teacher
    assert len(re.findall(r"^ +[01] +\d\.\d{3} +\d\.\d{3}$", out, re.M)) == 2
    assert re.search(r"^median held-out exact match: alone \d\.\d{3}, distilled \d\.\d{3} \(distillation", out, re.M)
