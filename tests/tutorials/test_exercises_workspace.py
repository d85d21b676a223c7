"""The learner track never loses work: it writes only workspaces that `start` made (never the
checkout), and copies the learner's code aside before it replaces it with stubs."""
import os

import pytest

from tutorials.exercises.__main__ import main
from tutorials.exercises.markers import exercises
from tutorials.exercises.workspace import BACKUPS, MARKER, REPO, copy_checkout

EXERCISES = exercises(REPO)
[LAYER_NORM] = EXERCISES["02.1"]  # LayerNorm's backward: one fence


def exit_line(argv, capsys, code=2):
    """main(argv) must exit `code` without a traceback; the last line of its message."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    status = exit_info.value.code
    if isinstance(status, str):  # sys.exit(message): exit status 1, the message on stderr
        status, message = 1, status
    else:
        message = capsys.readouterr().err
    assert status == code and "Traceback" not in message
    return message.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["start", "reset"])
@pytest.mark.parametrize("where", [REPO, REPO.parent])
def test_the_checkout_and_a_directory_holding_it_are_refused(command, where, capsys):
    paths = {fence.path for id, fences in EXERCISES.items() if id[:2] == "14" for fence in fences}
    library = {path: (REPO / path).read_text() for path in paths}
    try:
        line = exit_line([command, "14", "--workspace", str(where)], capsys)
    finally:  # should the refusal ever break, put the library back
        changed = {path for path, text in library.items() if (REPO / path).read_text() != text}
        for path in changed:
            (REPO / path).write_text(library[path])
    assert not changed, f"{command} --workspace {where} rewrote {changed}"
    assert line.endswith(f"--workspace {where} is (or holds) the library's checkout, whose code the stubs would "
                         f"overwrite: give a new directory, e.g. --workspace {REPO / 'workspace'}")


@pytest.mark.parametrize("command", ["start", "reset"])
@pytest.mark.parametrize("inside", ["minitensor/ws", "tutorials/a/b", "tests"])
def test_a_workspace_inside_what_start_copies_is_refused_before_copying(command, inside, capsys):
    where = REPO / inside
    existed = where.exists()
    line = exit_line([command, "05", "--workspace", str(where)], capsys)
    assert where.exists() == existed, f"{command} --workspace {where} made it"
    tree = REPO / inside.split("/")[0]
    assert line.endswith(f"--workspace {where} is inside {tree}, which start copies: the copy would hold itself; "
                         f"give a directory outside it, e.g. --workspace {REPO / 'workspace'}")


@pytest.mark.parametrize("command", ["start", "reset"])
def test_a_read_only_workspace_is_one_line(command, tmp_path, capsys, monkeypatch):
    """A read-only mount (access(2) says EROFS even to root): access denies writing under tmp_path."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: not (mode & os.W_OK and str(path).startswith(
        str(tmp_path))) and real_access(path, mode))
    line = exit_line([command, "05", "--workspace", str(tmp_path / "ws")], capsys)
    assert line.endswith(f"--workspace {tmp_path / 'ws'} cannot be written ({tmp_path} is read-only): "
                         "give a writable directory")
    assert not (tmp_path / "ws").exists()


def test_a_directory_start_did_not_make_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    line = exit_line(["start", "2", "--workspace", str(tmp_path)], capsys)
    assert line.endswith(f"--workspace {tmp_path} was not made by `start` (it has no {MARKER}), so its files are "
                         "not stubs to overwrite: give a new or empty directory")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert "no workspace at" in exit_line(["reset", "2", "--workspace", str(tmp_path / "new")], capsys)


def test_an_empty_directory_becomes_a_workspace(tmp_path, capsys):
    main(["start", "2", "--workspace", str(tmp_path)])
    assert (tmp_path / MARKER).read_text() == "02\n" and "raise NotImplementedError" in (
        tmp_path / LAYER_NORM.path).read_text()


def test_a_workspace_made_before_the_marker_came_first_is_still_one(tmp_path, capsys):
    copy_checkout(tmp_path / "ws", ("minitensor", "parallel"))  # what `start 2` left, marker written last
    (tmp_path / "ws" / MARKER).write_text("02\n")
    main(["start", "14", "--workspace", str(tmp_path / "ws")])
    assert (tmp_path / "ws" / MARKER).read_text() == "02 14\n"


def test_reset_copies_the_learners_code_aside_and_says_where(tmp_path, capsys):
    workspace = tmp_path / "ws"
    main(["start", "2", "--workspace", str(workspace)])
    mine = workspace / LAYER_NORM.path
    for attempt in ("first try", "second try"):  # two resets within a second: two copies
        mine.write_text(mine.read_text().replace("raise NotImplementedError(", f"return None  # {attempt} ("))
        capsys.readouterr()
        main(["reset", "2", "--workspace", str(workspace)])
        line = capsys.readouterr().out.splitlines()[0]
        assert line.startswith(f"your chapter 02 files as they were are copied to {workspace / BACKUPS}/")
        assert f"# {attempt} (" in (workspace / BACKUPS / line.rsplit("/", 1)[1] / LAYER_NORM.path).read_text()
    assert len(list((workspace / BACKUPS).iterdir())) == 2


def test_start_copies_edits_in_the_chapters_regions_aside(tmp_path, capsys):
    workspace = tmp_path / "ws"
    copy_checkout(workspace, ("minitensor", "parallel"))
    (workspace / MARKER).write_text("\n")
    mine = workspace / LAYER_NORM.path
    mine.write_text(mine.read_text().replace("dx *= rstd", "dx *= rstd  # my experiment"))
    main(["start", "2", "--workspace", str(workspace)])
    [folder] = (workspace / BACKUPS).iterdir()
    assert f"copied to {folder}" in capsys.readouterr().out
    assert "# my experiment" in (folder / LAYER_NORM.path).read_text()


def test_reset_over_a_removed_marker_is_one_line_and_keeps_the_copy(tmp_path, capsys):
    workspace = tmp_path / "ws"
    main(["start", "2", "--workspace", str(workspace)])
    mine = workspace / LAYER_NORM.path
    mine.write_text(mine.read_text().replace("# exercise 02.1:", "# (marker deleted) 02.1:"))
    line = exit_line(["reset", "2", "--workspace", str(workspace)], capsys, code=1)
    assert line.startswith(f"python -m tutorials.exercises reset: {mine}:") and "without an opening" in line
    [folder] = (workspace / BACKUPS).iterdir()
    assert (folder / LAYER_NORM.path).read_text() == mine.read_text()


def test_check_judges_an_exercise_beside_another_exercises_stub(tmp_path, capsys):
    """GPipe's test needs both 07.1 and 07.2: with 07.2 written (the reference) and 07.1 still a
    stub, 07.2 is judged alone (07.1 holds the library's answer for its check) and passes."""
    from tutorials.exercises.markers import replace_body
    from tutorials.exercises.workspace import matching_fence, reference_region
    workspace = tmp_path / "ws"
    main(["start", "7", "--workspace", str(workspace)])
    for fence in EXERCISES["07.2"]:
        text, theirs = matching_fence(fence, workspace)
        (workspace / fence.path).write_text(replace_body(text, theirs, reference_region(fence)))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "07", "--workspace", str(workspace)])
    out = capsys.readouterr().out
    assert exit_info.value.code == 1
    assert "07.1  the GPipe compute order" in out and "still a stub" in out
    [line] = [line for line in out.splitlines() if line.startswith("07.2")]
    assert line.endswith("pass") and "FAIL" not in out and "blocked" not in out
