"""The mutation check's data is well-formed and live: every mutant's original text still
stands exactly once in its file, and every test it names exists, so a refactor cannot
silently turn a mutant into one that measures nothing. (The mutants themselves are not
run here: that takes minutes; see tests/mutation/run.py and the README's Development
section. CI runs it after the suite.)"""
import ast
import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("mutation_run", HERE / "run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)

MUTANTS = run.load_mutants()
AREAS = ["minitensor/autograd.py", "minitensor/ops.py", "minitensor/nn/functional.py", "minitensor/optim.py",
         "parallel/comm/", "parallel/comm/ring.py", "parallel/mesh.py", "parallel/data_parallel/ddp.py",
         "parallel/data_parallel/zero.py", "parallel/tensor_parallel/mappings.py", "parallel/tensor_parallel/layers.py",
         "parallel/tensor_parallel/vocab.py", "parallel/pipeline/schedules.py", "parallel/pipeline/executor.py",
         "parallel/pipeline/checker.py", "parallel/checkpoint/", "parallel/plan/", "parallel/train/loop.py",
         "parallel/hybrid/gpt.py", "parallel/data_parallel/reducer.py", "parallel/tensor_parallel/model.py",
         "parallel/data_parallel/comm_hooks/", "parallel/data_parallel/local_sgd.py",
         "parallel/data_parallel/parameter_server.py", "parallel/data_parallel/gather_order.py",
         "parallel/data_parallel/flat_units.py", "parallel/hybrid/zero_units.py", "parallel/alpha_beta.py",
         "parallel/comm/link.py", "parallel/pipeline/zero_bubble.py", "parallel/pipeline/registry.py",
         "minitensor/amp.py", "minitensor/recompute.py", "parallel/context_parallel/", "minitensor/graph/"]


def test_at_least_100_mutants_with_unique_names_cover_every_mechanism():
    names = [m["name"] for m in MUTANTS]
    assert len(names) >= 100 and len(set(names)) == len(names)
    for area in AREAS:
        assert any(m["file"].startswith(area) for m in MUTANTS), f"no mutant in {area}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m["name"])
def test_every_mutant_names_an_existing_file_and_tests(mutant):
    assert (run.REPO / mutant["file"]).is_file()
    assert mutant["original"] and mutant["original"] != mutant["mutated"]
    assert mutant["tests"] and all(isinstance(t, str) for t in mutant["tests"])
    for test in mutant["tests"]:
        path = run.REPO / test.split("::")[0]
        assert path.is_file() and path.name.startswith("test_") and path.is_relative_to(run.REPO / "tests"), test


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m["name"])
def test_every_mutants_original_text_stands_exactly_once_in_its_file(mutant):
    path = run.REPO / mutant["file"]
    count = path.read_text().count(mutant["original"]) if path.is_file() else 0
    assert count == 1, (
        f"mutant {mutant['name']}: its original text occurs {count} times in {mutant['file']}, so the mutation "
        f"check cannot plant it. Find where that code lives now and update the mutant's file and original in "
        f"tests/mutation/mutants.toml (the same realistic bug), then run: python tests/mutation/run.py {mutant['name']}")


def functions_in(path):
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m["name"])
def test_every_test_a_mutant_names_exists(mutant):
    for test in mutant["tests"]:
        path, _, function = test.partition("::")
        assert (run.REPO / path).is_file(), f"mutant {mutant['name']}: no test file {path} (update its tests)"
        name = function.split("[")[0]
        assert not name or name in functions_in(run.REPO / path), (
            f"mutant {mutant['name']}: {path} has no test {name} (update its tests in tests/mutation/mutants.toml)")


def test_a_mutant_whose_original_text_is_gone_is_reported_and_counts_as_a_failure(tmp_path):
    (tmp_path / "lib.py").write_text("x = 1\n")
    gone = {"name": "gone", "file": "lib.py", "original": "x = 2", "mutated": "x = 3", "tests": ["test_x.py"]}
    assert run.run_one(gone, tmp_path, ["lib.py"], timeout=10)[0] == "original text not found"
    assert not run.plant(tmp_path, gone) and run.plant(tmp_path, {**gone, "original": "x = 1"})
    assert (tmp_path / "lib.py").read_text() == "x = 3\n"
