"""The mutation check: plant each realistic bug of mutants.toml and see a test catch it.

    python tests/mutation/run.py                 every mutant, 2 at a time
    python tests/mutation/run.py --list          the mutants, without running anything
    python tests/mutation/run.py NAME ...        only the mutants whose name contains NAME

For each mutant: copy the checkout (its tracked and untracked, not ignored files) into a
throwaway directory, replace the mutant's `original` text in its `file` by `mutated`
(the original must occur exactly once), and run pytest on the mutant's `tests` there,
with a per-mutant timeout. One line per mutant:

    caught                    a test failed (pytest exit 1): the bug is seen
    SURVIVED                  every test passed: the tests cannot tell this bug apart
    original text not found   the file changed since the mutant was written (or it is
                              ambiguous): update `original` in mutants.toml
    ERROR / TIMEOUT           pytest could not run the tests, or did not finish

The exit status is 0 only if every mutant was caught. The suite does not run this (it
takes minutes; CI runs it after the suite, .ci/run); tests/mutation/test_mutants.py checks
that the data is well-formed and live.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MUTANTS = HERE / "mutants.toml"
FIELDS = ("name", "file", "original", "mutated", "tests")


def load_mutants(path=MUTANTS):
    """The [[mutant]] tables of the data file, each checked to have every field."""
    mutants = tomllib.loads(Path(path).read_text())["mutant"]
    for number, mutant in enumerate(mutants):
        missing = [field for field in FIELDS if field not in mutant]
        if missing:
            raise ValueError(f"mutant #{number} ({mutant.get('name', '?')}) lacks {missing}")
    return mutants


def checkout_files(repo):
    """Paths (relative to repo) of the files a copy needs: git's tracked and untracked,
    not ignored ones; without git, everything but caches and virtual environments."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                 cwd=repo, capture_output=True, check=True).stdout
        return [name for name in listing.decode().split("\0") if name and (repo / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".venv", ".hypothesis", ".pytest_cache"}
        return [str(p.relative_to(repo)) for p in repo.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(repo).parts)]


def copy_checkout(repo, files, target):
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target / name)


def plant(copy, mutant):
    """Replace the original text by the mutated one in the copy; False if it does not occur
    exactly once."""
    path = copy / mutant["file"]
    text = path.read_text() if path.is_file() else ""
    if text.count(mutant["original"]) != 1:
        return False
    path.write_text(text.replace(mutant["original"], mutant["mutated"]))
    return True


def run_one(mutant, repo, files, timeout):
    """(verdict, seconds, detail) of one mutant."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        copy = Path(tmp)
        copy_checkout(repo, files, copy)
        if not plant(copy, mutant):
            return "original text not found", 0.0, f"in {mutant['file']}: {mutant['original']!r}"
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *mutant["tests"]]
        try:
            done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "TIMEOUT", time.perf_counter() - start, f"after {timeout} s"
    seconds = time.perf_counter() - start
    if done.returncode == 1:
        return "caught", seconds, ""
    if done.returncode == 0:
        return "SURVIVED", seconds, ""
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return "ERROR", seconds, f"pytest exit {done.returncode}: " + " | ".join(tail)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Plant each mutant of mutants.toml and run its tests.")
    parser.add_argument("names", nargs="*", help="run only the mutants whose name contains one of these")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at the same time (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant (default 300)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = parser.parse_args(argv)
    mutants = [m for m in load_mutants() if not args.names or any(n in m["name"] for n in args.names)]
    if not mutants:
        parser.error(f"no mutant name contains any of {args.names}")
    if args.list:
        for m in mutants:
            print(f"{m['name']:40s} {m['file']}")
        return 0
    return run_all(mutants, args.jobs, args.timeout)


def run_all(mutants, jobs=2, timeout=300, repo=REPO):
    """Plant each mutant in its own copy of `repo`, `jobs` at a time, printing one line per
    mutant and a summary; 1 if any was not caught, else 0. The learner track's wrong answers
    (python -m tutorials.exercises wrong) run through here too, as mutants of their fences."""
    files = checkout_files(repo)
    width = max(len(m["name"]) for m in mutants)
    start = time.perf_counter()

    def report(mutant):
        verdict, seconds, detail = run_one(mutant, repo, files, timeout)
        print(f"{mutant['name']:{width}s}  {verdict:8s} {seconds:6.1f} s  {detail}".rstrip(), flush=True)
        return verdict == "caught"

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        failed = sum(not caught for caught in pool.map(report, mutants))
    print(f"{len(mutants) - failed} of {len(mutants)} mutants caught, {failed} not, "
          f"in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
