"""A learner's workspace: a copy of the checkout whose exercise regions are stubs.

The reference is the library in this checkout; a workspace is a plain copy of
minitensor/, parallel/, tests/, tutorials/ and the pytest configuration, so its tests
import the workspace's code (setup.cfg puts the directory first on sys.path). Every
operation works fence by fence: stubbing chapter 5 leaves your chapter 4 work alone.

Only a workspace is ever written: a directory holding MARKER, which `start` writes right
after copying (workspaces made before the marker was written first have it too: `start`
always wrote it, listing the chapters stubbed). The checkout itself, or a directory holding
it, is never one; and before code is replaced, its files are copied to BACKUPS.
"""
import os
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from .markers import exercises, find_fences, replace_body

REPO = Path(__file__).resolve().parents[2]
COPIED = ("minitensor", "parallel", "tests", "tutorials", "setup.cfg", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
MARKER = ".exercises-started"  # in a workspace: the chapters `start` has stubbed (maybe none yet)
BACKUPS = ".exercises-backups"  # in a workspace: one dated folder per `reset` (or `start` over edits)


def copy_checkout(destination, names=COPIED, source=REPO):
    """Copy the reference files `names` (default: all a workspace needs) into `destination`,
    which must not exist or be empty."""
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (source / name).is_dir():
            shutil.copytree(source / name, destination / name, ignore=IGNORED)
        else:
            shutil.copy2(source / name, destination / name)


def library_roots():
    """The checkout and the directories that hold the minitensor and parallel packages Python imports."""
    return {REPO} | {Path(find_spec(name).origin).resolve().parents[1] for name in ("minitensor", "parallel")}


def is_empty_or_new(directory):
    return not directory.exists() or directory.is_dir() and not any(directory.iterdir())


def workspace_problem(workspace, new_ok):
    """Why `workspace` may not be written as a learner's workspace (one line), or None. With
    new_ok (`start`), a new or empty directory is fine too: start makes it a workspace."""
    workspace = Path(workspace).resolve()
    if any(root == workspace or workspace in root.parents for root in library_roots()):
        return (f"--workspace {workspace} is (or holds) the library's checkout, whose code the stubs would "
                f"overwrite: give a new directory, e.g. --workspace {REPO / 'workspace'}")
    inside = [tree for tree in (root / name for root in library_roots() for name in COPIED[:4])
              if tree == workspace or tree in workspace.parents]
    if inside:
        return (f"--workspace {workspace} is inside {inside[0]}, which start copies: the copy would hold itself; "
                f"give a directory outside it, e.g. --workspace {REPO / 'workspace'}")
    existing = next(path for path in (workspace, *workspace.parents) if path.exists())
    if not os.access(existing, os.W_OK):
        return f"--workspace {workspace} cannot be written ({existing} is read-only): give a writable directory"
    if (workspace / MARKER).is_file() or new_ok and is_empty_or_new(workspace):
        return None
    if is_empty_or_new(workspace):
        return f"no workspace at {workspace}: make one with `python -m tutorials.exercises start NN --workspace DIR`"
    return (f"--workspace {workspace} was not made by `start` (it has no {MARKER}), so its files are not "
            f"stubs to overwrite: give a new or empty directory")


def back_up(paths, workspace):
    """Copy the workspace's files `paths` (those it has) into a new BACKUPS/<date>_<time>[-n]
    folder of it; that folder."""
    base = Path(workspace) / BACKUPS / time.strftime("%Y-%m-%d_%H-%M-%S")
    folder, n = base, 1
    while folder.exists():  # a second reset in the same second must not overwrite the first's copy
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    folder.mkdir(parents=True)
    for path in sorted({path for path in paths if (Path(workspace) / path).is_file()}):
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(workspace) / path, folder / path)
    return folder


def matching_fence(fence, workspace):
    """The fence in `workspace`'s copy of fence.path with fence's id and position among that id's fences."""
    path = Path(workspace) / fence.path
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; copy it back from {REPO / fence.path}")
    text = path.read_text()
    reference = (REPO / fence.path).read_text()
    same_id = [f for f in find_fences(reference, fence.path) if f.id == fence.id]
    theirs = [f for f in find_fences(text, str(path)) if f.id == fence.id]
    if len(theirs) != len(same_id):
        raise ValueError(f"{path}: the markers of exercise {fence.id} were changed or removed "
                         f"(found {len(theirs)} fences, the reference has {len(same_id)}); "
                         f"restore the marker lines, or copy the file back from {REPO / fence.path}")
    return text, theirs[same_id.index(fence)]


def region(fence, workspace):
    """The body of `fence` as it stands in the workspace (lines)."""
    text, theirs = matching_fence(fence, workspace)
    return theirs.body(text.split("\n"))


def reference_region(fence):
    return fence.body((REPO / fence.path).read_text().split("\n"))


def write_stub(fence, workspace):
    """Put `fence`'s stub into the workspace (whatever the region held)."""
    text, theirs = matching_fence(fence, workspace)
    (Path(workspace) / fence.path).write_text(replace_body(text, theirs, fence.stub_lines()))


def alone(id, workspace, destination):
    """A copy of `workspace` at `destination` where every exercise but `id` holds the library's
    answer (its reference region), so that `id`'s tests judge the learner's `id` and nothing else;
    `destination`."""
    copy_checkout(destination, source=Path(workspace))
    for other, fences in exercises(REPO).items():
        for fence in fences if other != id else ():
            text, theirs = matching_fence(fence, destination)
            (Path(destination) / fence.path).write_text(replace_body(text, theirs, reference_region(fence)))
    return Path(destination)


def run_tests(root, node_ids, timeout=300):
    """Run pytest on `node_ids` in the checkout or workspace `root`; the CompletedProcess
    (output in .stdout). One BLAS thread, no cache directory, failed node ids listed (-rf),
    no bytecode written (a file stubbed and restored within a second must not run stale),
    hypothesis without its slow explain phase (tests/conftest.py's "exercises" profile)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="exercises")
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    # one process (-n 0): a few tests start faster alone than pytest-xdist's workers do
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rf", "--tb=line",
               *node_ids]
    try:
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # a learner's loop that never ends: a failure like any other
        return subprocess.CompletedProcess(command, -1, f"pytest timed out after {timeout} s", "")


def failed_node_ids(output):
    """The node ids pytest's `-rf` summary lists as FAILED."""
    return [line.split()[1] for line in output.splitlines() if line.startswith("FAILED ")]
