"""The learner track: its answer key is the library, so every exercise's stub must fail its tests.

Only the stubbed half runs here: that the library passes the same tests is what the rest
of the suite proves. Each exercise is stubbed ALONE in a copy of the checkout, so a test
that failed only because of another exercise's stub cannot hide a test that misses its own.
"""
import ast
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tutorials.exercises.catalog import TESTS
from tutorials.exercises.markers import MarkerError, check_fences, exercises, find_fences, replace_body, stub_text
from tutorials.exercises.workspace import REPO, copy_checkout, failed_node_ids, run_tests
from tutorials.exercises.wrong import load_wrong_answers, planted

EXERCISES = exercises(REPO)  # also checks every fence of the library
TEST_FILES_NEEDED = ("minitensor", "parallel", "tests", "setup.cfg")


def test_every_exercise_has_tests_and_its_chapter_readme_points_at_it():
    assert sorted(TESTS) == sorted(EXERCISES)
    for id in EXERCISES:
        [readme] = REPO.glob(f"tutorials/{id[:2]}_*/README.md")
        text = readme.read_text()
        assert "## Write it yourself" in text and f"{id}" in text, f"{readme} does not point at exercise {id}"


def test_every_chapter_has_its_sections_and_a_predict_then_run_question_with_its_answer():
    """The course README promises these in every chapter (tutorials/README.md)."""
    for readme in sorted(REPO.glob("tutorials/[0-9][0-9]_*/README.md")):
        text = readme.read_text()
        for needed in ("**Before you start:**", "**Time:**", "## What you will see", "## Predict, then run",
                       "<summary>Answer</summary>", "## Write it yourself"):
            assert needed in text, f"{readme.relative_to(REPO)} has no {needed!r}"


CLAIM = re.compile(r"<!--.*?-->", re.S)
# a number worth giving away: one with a decimal point (0.2727), thousands commas (7,770) or three digits or more
NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+|\d{3,})(?!\w)")
ANSWER = "<details><summary>Answer</summary>"


def answered_above(text):
    """[(question's last line, numbers)]: each predict question whose answer holds a number that
    the chapter already printed above the question (a number the question itself names aside)."""
    start = text.index("## Predict, then run")
    end = text.find("\n## ", start + 1)
    found = []
    for block in re.finditer(rf"(?s)(.*?){re.escape(ANSWER)}(.*?)</details>", text[start:end if end > 0 else None]):
        question, answer = CLAIM.sub("", block[1]), CLAIM.sub("", block[2])
        above = CLAIM.sub("", text[:start + block.start(1)])
        numbers = set(NUMBER.findall(answer)) - set(NUMBER.findall(question))
        shown = sorted(n for n in numbers if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", above))
        if shown:
            found.append((question.strip().splitlines()[-1], shown))
    return found


def test_answered_above_finds_a_number_printed_before_its_question():
    text = ("## What you will see\nbubble 0.2727\n## Predict, then run\nThe bubble at p = 4?\n"
            f"{ANSWER}\n0.2727, and 1,000 steps\n</details>\n")
    assert answered_above(text) == [("The bubble at p = 4?", ["0.2727"])]
    assert answered_above(text.replace("bubble 0.2727", "bubble: the question below")) == []


CHAPTERS = sorted(path.parent.name for path in REPO.glob("tutorials/[0-9][0-9]_*/README.md"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_predict_question_is_answered_above_it(chapter):
    """Predict, then run: the chapter must not have printed the answer's numbers before the question."""
    assert answered_above((REPO / "tutorials" / chapter / "README.md").read_text()) == []


def test_the_stubbed_library_is_valid_python():
    for path in {fence.path for fences in EXERCISES.values() for fence in fences}:
        text = (REPO / path).read_text()
        ast.parse(stub_text(text, find_fences(text, path)), filename=path)


SOURCE = '''def f(x):
    y = x + 1
    # exercise 01.9: double it
    # hint: times two
    y = y * 2
    # end exercise
    return y
'''


WRONG = load_wrong_answers()


def test_every_exercise_has_two_wrong_answers_or_more_and_each_names_an_exercise():
    """The corpus is live: `python -m tutorials.exercises wrong` (CI) plants each and needs its tests to fail."""
    counts = Counter(answer["exercise"] for answer in WRONG)
    assert not set(counts) - set(EXERCISES), f"wrong answers for exercises that do not exist: {set(counts) - set(EXERCISES)}"
    few = {id: counts[id] for id in EXERCISES if counts[id] < 2}
    assert not few, f"exercises with fewer than two wrong answers (tutorials/exercises/wrong_answers/): {few}"
    names = Counter((answer["exercise"], answer["name"]) for answer in WRONG)
    assert max(names.values()) == 1 and all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for _, n in names), names


def test_the_course_readme_quotes_the_count_of_wrong_answers():
    text = (REPO / "tutorials" / "README.md").read_text()
    assert f"**{len(WRONG)} wrong answers** to the {len(EXERCISES)} exercises" in text


@pytest.mark.parametrize("answer", WRONG, ids=lambda a: f"{a['exercise']}-{a['name']}")
def test_every_wrong_answer_is_valid_python_in_place_and_differs_from_the_library(answer):
    path, original, wrong = planted(answer, REPO, EXERCISES)
    text = (REPO / path).read_text()
    assert text.count(original) == 1 and answer["why"].strip()
    mistaken = ast.parse(text.replace(original, wrong), filename=path)  # a body indented unlike its fence fails here
    assert ast.dump(mistaken) != ast.dump(ast.parse(text)), "the wrong answer is the library's code"


def test_a_stub_raises_with_the_title_and_hint_at_the_fence():
    namespace = {}
    exec(stub_text(SOURCE, find_fences(SOURCE, "f.py")), namespace)
    with pytest.raises(NotImplementedError, match=re.escape("exercise 01.9: double it. Hint: times two")):
        namespace["f"](1)


@pytest.mark.parametrize("source, message", [
    ("# exercise 01.1: at module level\nx = 1\n# end exercise\n", "inside a function or method body"),
    ("def f():\n    # exercise 01.1: nothing\n    # end exercise\n    return 1\n", "holds no statement"),
    ("def f():\n    if True:\n        # exercise 01.1: half an if\n        x = 1\n    else:\n        x = 2\n"
     "        # end exercise\n", "cuts the statement at line 2"),
    ("def f():\n    # exercise 01.1: open\n    return 1\n", "has no '# end exercise'"),
    ("def f():\n    # exercise 1.1: one digit\n    return 1\n    # end exercise\n", "malformed marker"),
])
def test_a_fence_that_cannot_become_a_stub_is_named(source, message):
    with pytest.raises(MarkerError, match=re.escape(message)):
        check_fences(source, "f.py", find_fences(source, "f.py"))


@pytest.mark.deep  # a pytest run per exercise: minutes; .ci/run runs it (pytest -m deep)
def test_each_stub_fails_every_test_listed_for_it(tmp_path):
    ids = list(EXERCISES)
    with ThreadPoolExecutor(2) as pool:  # two copies of the checkout, half the exercises each
        halves = pool.map(stub_each_and_run, [tmp_path / "a", tmp_path / "b"], [ids[0::2], ids[1::2]])
        problems = [problem for half in halves for problem in half]
    assert not problems, "\n\n".join(problems)


def stub_each_and_run(root, ids):
    """In a fresh copy at `root`: stub one exercise, run its tests, restore; the problems found."""
    copy_checkout(root, TEST_FILES_NEEDED)
    problems = []
    for id in ids:
        originals = {fence.path: (root / fence.path).read_text() for fence in EXERCISES[id]}
        for path, text in originals.items():
            (root / path).write_text(stub_text(text, [f for f in EXERCISES[id] if f.path == path]))
        result = run_tests(root, TESTS[id], timeout=120)
        for path, text in originals.items():
            (root / path).write_text(text)
        failed = failed_node_ids(result.stdout)
        missed = [node for node in TESTS[id] if not any(f == node or f.startswith(node + "[") for f in failed)]
        if result.returncode != 1 or missed or f"exercise {id}" not in result.stdout:
            problems.append(f"exercise {id}: pytest exited {result.returncode}, tests that did not fail: {missed}\n"
                            f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return problems


def test_start_diff_reset_work_fence_by_fence(tmp_path, capsys):
    from tutorials.exercises.__main__ import main
    workspace, [fence] = tmp_path / "ws", EXERCISES["02.1"]
    main(["start", "2", "--workspace", str(workspace)])
    mine = workspace / fence.path
    assert "raise NotImplementedError('exercise 02.1: LayerNorm backward. Hint: use the saved" in mine.read_text()
    chapter_2 = [f for id, fences in EXERCISES.items() if id[:2] == "02" for f in fences if f.path == fence.path]
    assert mine.read_text().count("raise NotImplementedError(") == len(chapter_2)  # those, nothing else
    with pytest.raises(SystemExit, match="already started"):
        main(["start", "2", "--workspace", str(workspace)])
    capsys.readouterr()
    main(["diff", "2", "--workspace", str(workspace)])
    assert "-        dx *= rstd" in capsys.readouterr().out  # the fence ends before the rounding to 16 bits
    mine.write_text(mine.read_text().replace("raise NotImplementedError('exercise 02.1", "return None  # ('"))
    main(["reset", "2", "--workspace", str(workspace)])
    assert mine.read_text() == stub_text((REPO / fence.path).read_text(), find_fences((REPO / fence.path).read_text(), fence.path))


def test_check_one_exercise_runs_only_its_tests(capsys):
    from tutorials.exercises.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "5.2", "--reference"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "05.2  column-parallel forward" in out and "05.1" not in out
    assert "1 of 1 exercise 05.2 pass" in out
    with pytest.raises(SystemExit, match="chapter 05 has no exercise 05.9; it has 05.1, 05.2, 05.3"):
        main(["check", "05.9", "--reference"])


@pytest.mark.deep  # two copies of the checkout and two pytest runs: a minute on a loaded machine
def test_check_judges_an_exercise_alone_whatever_the_others_hold(tmp_path, capsys):
    """GPipe's test needs 07.1 and 07.2: with 07.2 still a stub, a right 07.1 passes and a wrong one fails."""
    from tutorials.exercises.__main__ import main
    from tutorials.exercises.workspace import write_stub
    workspace, [fence] = tmp_path / "ws", EXERCISES["07.1"]
    main(["start", "7", "--workspace", str(workspace)])
    mine = workspace / fence.path
    stubbed = mine.read_text()
    mine.write_text(replace_body(stubbed, find_fences(stubbed, fence.path)[0], fence.body(
        (REPO / fence.path).read_text().split("\n"))))  # the library's 07.1, beside 07.2's stub
    assert "raise NotImplementedError(\"exercise 07.2: what a compute waits for" in mine.read_text()
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "7.1", "--workspace", str(workspace)])
    assert exit_info.value.code == 0 and "07.1  the GPipe compute order" in capsys.readouterr().out
    mine.write_text(mine.read_text().replace("warmup=m)", "warmup=0)"))
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "7.1", "--workspace", str(workspace)])
    assert exit_info.value.code == 1 and "FAIL" in capsys.readouterr().out
    write_stub(fence, workspace)
