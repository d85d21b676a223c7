"""Wrong answers: plausible mistakes a learner makes in each exercise, each of which the
exercise's tests must catch (the mutation check of tests/mutation, applied to the learner track).

    python -m tutorials.exercises wrong             plant every wrong answer, run its exercise's tests
    python -m tutorials.exercises wrong 13 20.1     only chapter 13's and exercise 20.1's

wrong_answers/NN.toml holds chapter NN's, one table each:

    [[wrong]]
    exercise = "13.2"
    name = "always-the-stalest"
    why = "the plausible mistake in one line"
    body = '''
                tau[w][t] = max(0, t - staleness)
    '''
    fence = 2    # optional: which of the exercise's fences (in file order) the body replaces; default 1

`body` replaces the lines between the fence's markers (hint lines included), verbatim, so it
is indented as the fenced code is. Each wrong answer becomes a mutant (the fence as it stands,
replaced by the fence around the wrong body) and runs through tests/mutation/run.py's
machinery, in a throwaway copy of the checkout where every other exercise keeps the
library's answer: the exercise is judged alone. Each must be caught (a listed test fails).
"""
import importlib.util
import tomllib
from pathlib import Path

from .catalog import TESTS
from .markers import exercises
from .workspace import REPO

CORPUS = Path(__file__).resolve().parent / "wrong_answers"
FIELDS = ("exercise", "name", "why", "body")


def load_wrong_answers(directory=CORPUS):
    """Every [[wrong]] table of directory/NN.toml, in file order, each checked to have every
    field and to sit in its chapter's file."""
    answers = []
    for path in sorted(Path(directory).glob("*.toml")):
        for number, answer in enumerate(tomllib.loads(path.read_text()).get("wrong", [])):
            missing = [field for field in FIELDS if not isinstance(answer.get(field), str)]
            if missing:
                raise ValueError(f"{path.name}: wrong answer #{number + 1} ({answer.get('name', '?')}) lacks {missing}")
            if answer["exercise"][:2] != path.stem:
                raise ValueError(f"{path.name}: wrong answer {answer['name']} is for exercise {answer['exercise']}, "
                                 f"which belongs in {answer['exercise'][:2]}.toml")
            answers.append(answer)
    return answers


def planted(answer, root=REPO, found=None):
    """(path, fence text as it stands, the same fence around the wrong body) of `answer` in `root`;
    `found`: exercises(root), if already at hand."""
    fences = (found or exercises(root)).get(answer["exercise"])
    if fences is None:
        raise ValueError(f"wrong answer {answer['name']}: no exercise {answer['exercise']} in the library")
    index = answer.get("fence", 1)
    if not 1 <= index <= len(fences):
        raise ValueError(f"wrong answer {answer['name']}: exercise {answer['exercise']} has {len(fences)} fence(s), "
                         f"not a fence {index}")
    fence = fences[index - 1]
    lines = (Path(root) / fence.path).read_text().split("\n")
    original = lines[fence.start:fence.end + 1]
    wrong = [original[0], *answer["body"].rstrip("\n").split("\n"), original[-1]]
    return fence.path, "\n".join(original), "\n".join(wrong)


def as_mutant(answer, root=REPO, found=None):
    """The wrong answer as tests/mutation/run.py's mutant: its exercise's catalog tests must fail."""
    path, original, wrong = planted(answer, root, found)
    return {"name": f"{answer['exercise']} {answer['name']}", "file": path, "original": original,
            "mutated": wrong, "tests": TESTS[answer["exercise"]]}


def mutation_runner(root=REPO):
    """tests/mutation/run.py, loaded from the checkout (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("mutation_run", Path(root) / "tests" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_wrong_answers(selected=(), jobs=2, timeout=300):
    """Plant the wrong answers of the chapters or exercises `selected` (all if none), one copy
    each; 0 if every one was caught, else 1."""
    answers = [a for a in load_wrong_answers()
               if not selected or any(a["exercise"] == s or a["exercise"][:2] == s for s in selected)]
    if not answers:
        raise ValueError(f"no wrong answers for {' '.join(selected)}")
    found = exercises(REPO)
    return mutation_runner().run_all([as_mutant(a, REPO, found) for a in answers], jobs, timeout)
