"""A learner's workspace: a copy of the checkout whose exercise regions are stubs.

The reference is the library in this checkout; a workspace is a plain copy of
minitensor/, parallel/, tests/, tutorials/ and the pytest configuration, so its tests
import the workspace's code (setup.cfg puts the directory first on sys.path). Every
operation works fence by fence: stubbing chapter 5 leaves your chapter 4 work alone.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .markers import find_fences, replace_body

REPO = Path(__file__).resolve().parents[2]
COPIED = ("minitensor", "parallel", "tests", "tutorials", "setup.cfg", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")


def copy_checkout(destination, names=COPIED, source=REPO):
    """Copy the reference files `names` (default: all a workspace needs) into `destination`,
    which must not exist."""
    destination = Path(destination)
    destination.mkdir(parents=True)
    for name in names:
        if (source / name).is_dir():
            shutil.copytree(source / name, destination / name, ignore=IGNORED)
        else:
            shutil.copy2(source / name, destination / name)


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


def run_tests(root, node_ids, timeout=300):
    """Run pytest on `node_ids` in the checkout or workspace `root`; the CompletedProcess
    (output in .stdout). One BLAS thread, no cache directory, failed node ids listed (-rf),
    no bytecode written (a file stubbed and restored within a second must not run stale),
    hypothesis without its slow explain phase (tests/conftest.py's "exercises" profile)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="exercises")
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "--tb=line", *node_ids]
    try:
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # a learner's loop that never ends: a failure like any other
        return subprocess.CompletedProcess(command, -1, f"pytest timed out after {timeout} s", "")


def failed_node_ids(output):
    """The node ids pytest's `-rf` summary lists as FAILED."""
    return [line.split()[1] for line in output.splitlines() if line.startswith("FAILED ")]
