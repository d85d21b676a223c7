"""The learner track: write the heart of each mechanism yourself, checked by the library's own tests.

    python -m tutorials.exercises list [NN]     the exercises (of chapter NN), their files and tests
    python -m tutorials.exercises start NN      copy the checkout to ./workspace (once) and stub chapter NN
    python -m tutorials.exercises check NN      run each exercise's tests against the workspace
    python -m tutorials.exercises check NN.k    only exercise NN.k's (seconds)
    python -m tutorials.exercises diff NN       your code next to the reference (the library itself)
    python -m tutorials.exercises reset NN      put chapter NN's stubs back (your code: copied to .exercises-backups/)
    python -m tutorials.exercises wrong [NN.k]  plant each plausible wrong answer (wrong_answers/): its tests must fail

`check` judges each exercise alone: its tests run in a throwaway copy of the workspace where
every OTHER exercise holds the library's answer, so a stub (or a slip) elsewhere cannot decide it.

Run from the checkout root; `--workspace DIR` picks another directory: a new or empty one, or
one `start` made (never the checkout). See tutorials/README.md.
"""
import argparse
import difflib
import sys
import tempfile
from pathlib import Path

from .catalog import TESTS
from .markers import exercises
from .workspace import (MARKER, REPO, alone, back_up, copy_checkout, failed_node_ids, reference_region, region,
                        run_tests, workspace_problem, write_stub)
from .wrong import run_wrong_answers


def chapter_number(text):
    if not text.isdigit() or not 1 <= int(text) <= 99:
        raise argparse.ArgumentTypeError(f"chapter {text!r} must be a number from 1 to 99")
    return f"{int(text):02d}"


def chapter_or_exercise(text):
    """`check`'s argument: a chapter (05: all its exercises) or one exercise (05.2, or 5.2)."""
    chapter, dot, number = text.partition(".")
    if dot and not number.isdigit():
        raise argparse.ArgumentTypeError(f"exercise {text!r} must be NN.k, e.g. 05.2")
    return chapter_number(chapter) + (f".{int(number)}" if dot else "")


def chapter_exercises(chapter):
    """{id: fences} of `chapter` in the reference; exits naming the chapters that have exercises."""
    found = {id: fences for id, fences in exercises(REPO).items() if id[:2] == chapter}
    if not found:
        chapters = sorted({id[:2] for id in exercises(REPO)})
        sys.exit(f"chapter {chapter} has no exercises; chapters with exercises: {', '.join(chapters)}")
    return found


def where(fences):
    return ", ".join(f"{f.path}:{f.start + 1}" for f in fences)


def list_exercises(args):
    for id, fences in exercises(REPO).items():
        if args.chapter in (None, id[:2]):
            print(f"{id}  {fences[0].title}\n      write: {where(fences)}\n      tests: {' '.join(TESTS.get(id, []))}")


def start(args):
    workspace, found = args.workspace, chapter_exercises(args.chapter)
    if not (workspace / MARKER).exists():
        copy_checkout(workspace)
        mark_started(workspace)  # the marker first: a start stopped halfway still leaves a workspace
        print(f"copied the checkout to {workspace}")
    if args.chapter in started_chapters(workspace):
        sys.exit(f"chapter {args.chapter} is already started in {workspace}: `check {args.chapter}` to test "
                 f"your code, `reset {args.chapter}` to start over")
    edited = [f.path for fences in found.values() for f in fences if region(f, workspace) != reference_region(f)]
    if edited:
        print(f"your edits in chapter {args.chapter}'s regions are copied to {back_up(edited, workspace)}")
    for id, fences in found.items():
        for fence in fences:
            write_stub(fence, workspace)
        print(f"{id}  {fences[0].title}: stubbed in {where(fences)}")
    mark_started(workspace, args.chapter)
    print(f"\nWrite the fenced code in {workspace}, then: python -m tutorials.exercises check {args.chapter}")


def started_chapters(workspace):
    path = workspace / MARKER
    return path.read_text().split() if path.exists() else []


def mark_started(workspace, *chapters):
    """Add `chapters` to the workspace's marker (written, listing none, when there are none)."""
    known = started_chapters(workspace)
    (workspace / MARKER).write_text(" ".join(sorted(set(known + list(chapters)))) + "\n")


def is_stub(fence, workspace):
    return region(fence, workspace) == fence.stub_lines()


def check(args):
    root = REPO if args.reference else args.workspace
    if not root.exists():
        sys.exit(f"no workspace at {root}; run: python -m tutorials.exercises start {args.chapter}")
    chapter, _, number = args.chapter.partition(".")
    found, failed = chapter_exercises(chapter), 0
    if number:  # one exercise: only its tests run
        if args.chapter not in found:
            sys.exit(f"chapter {chapter} has no exercise {args.chapter}; it has {', '.join(found)}")
        found = {args.chapter: found[args.chapter]}
    if not args.reference and chapter not in started_chapters(root):
        print(f"(chapter {chapter} is not started in {root}: its code is still the library's)")
    for id, fences in found.items():
        stubbed = not args.reference and any(is_stub(f, root) for f in fences)
        if args.reference:
            result = run_tests(root, TESTS[id])
        else:  # judged alone: every other exercise holds the library's answer in a throwaway copy
            with tempfile.TemporaryDirectory(prefix=f"exercise-{id}-") as copy:
                result = run_tests(alone(id, root, Path(copy)), TESTS[id])
        verdict = "pass" if result.returncode == 0 else "still a stub" if stubbed else "FAIL"
        failed += result.returncode != 0
        print(f"{id}  {fences[0].title:48s} {verdict}")
        if result.returncode != 0 and not stubbed:
            print("\n".join("      " + line for line in result.stdout.splitlines()[-12:]))
            print(f"      failing: {' '.join(failed_node_ids(result.stdout)) or 'see above'}")
    what = f"exercise {args.chapter}" if number else f"exercises of chapter {chapter}"
    print(f"\n{len(found) - failed} of {len(found)} {what} pass ({root})")
    sys.exit(1 if failed else 0)


def wrong(args):
    sys.exit(run_wrong_answers(args.ids, args.jobs))


def diff(args):
    for id, fences in chapter_exercises(args.chapter).items():
        for fence in fences:
            mine = region(fence, args.workspace)
            lines = difflib.unified_diff(reference_region(fence), mine, lineterm="",
                                         fromfile=f"reference {fence.path}:{fence.start + 1}",
                                         tofile=f"workspace {fence.path}  (exercise {id})")
            print("\n".join(lines) or f"exercise {id} ({fence.path}): same as the reference")


def reset(args):
    found = chapter_exercises(args.chapter)
    folder = back_up([f.path for fences in found.values() for f in fences], args.workspace)
    print(f"your chapter {args.chapter} files as they were are copied to {folder}")
    for id, fences in found.items():
        for fence in fences:
            write_stub(fence, args.workspace)
        print(f"{id}  {fences[0].title}: stub restored in {where(fences)}")
    mark_started(args.workspace, args.chapter)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.exercises", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    wrongs = commands.add_parser("wrong", help="plant every wrong answer of wrong_answers/; each must fail its tests")
    wrongs.add_argument("ids", nargs="*", type=chapter_or_exercise, metavar="NN[.k]", help="only these (default: all)")
    wrongs.add_argument("--jobs", type=int, default=2, help="wrong answers run at the same time (default 2)")
    wrongs.set_defaults(run=wrong)
    for name, action, chapter in (("list", list_exercises, "?"), ("start", start, None), ("check", check, None),
                                  ("diff", diff, None), ("reset", reset, None)):
        command = commands.add_parser(name)
        if name == "check":
            command.add_argument("chapter", type=chapter_or_exercise, metavar="NN[.k]",
                                 help="a chapter (all its exercises) or one exercise, e.g. 05.2 (seconds)")
        else:
            command.add_argument("chapter", type=chapter_number, nargs=chapter, help="chapter number, 1 to 99")
        command.set_defaults(run=action)
        command.add_argument("--workspace", type=Path, default=Path("workspace").resolve(),
                             help="the workspace directory (default: ./workspace)")
        if name == "check":
            command.add_argument("--reference", action="store_true", help="check the library itself instead")
    args = parser.parse_args(argv)
    if args.command in ("start", "diff", "reset"):  # the commands that write stubs or read them
        problem = workspace_problem(args.workspace, new_ok=args.command == "start")
        if problem:
            parser.error(problem)
    try:
        args.run(args)
    except (FileNotFoundError, ValueError) as error:  # matching_fence's: a file or a marker the learner removed
        sys.exit(f"python -m tutorials.exercises {args.command}: {error}")


if __name__ == "__main__":
    main()
