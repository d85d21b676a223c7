"""`python -m tutorials.pictures`: every picture renders (with matplotlib), every picture
has its text form (without it), and every committed picture is shown in its chapter."""
import sys
from dataclasses import replace
from importlib.util import find_spec

import pytest
from mpi_launch import REPO, run_command

from tutorials.pictures import PICTURES, TUTORIALS, cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def pictures_command(*args, hide_matplotlib=False):
    """Run the command as a reader would, from the checkout root; `hide_matplotlib` makes
    `import matplotlib` fail in it, as on a machine without the plots extra."""
    hide = "import sys; sys.modules['matplotlib'] = None; " if hide_matplotlib else ""
    code = hide + f"from tutorials.pictures import main; main({list(map(str, args))!r})"
    return run_command([sys.executable, "-c", code], timeout=900, cwd=REPO).stdout


def test_without_matplotlib_the_command_prints_each_pictures_text_form():
    out = pictures_command("mesh_grid", "interleaved", "ring_steps", hide_matplotlib=True)
    assert "matplotlib is not installed (pip install -e '.[plots]')" in out
    assert "=== 09_3d: mesh_grid" in out and "mesh dp=2 x tp=2 x pp=2 over 8 ranks" in out
    assert "=== 08_1f1b_recomputation: interleaved" in out and "rank 0 | F0a F1a F0b" in out
    assert "=== 03_collectives: ring_steps" in out and "reduce-scatter step 1" in out
    assert ".png" not in out


@pytest.mark.skipif(find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (pip install -e '.[plots]'): pictures not rendered; "
                           "the text form is tested without it")
def test_every_picture_renders_a_small_png(tmp_path):
    out = pictures_command("--quick", "--out", tmp_path)
    for picture in PICTURES:
        path = tmp_path / picture.chapter / "pictures" / f"{picture.name}.png"
        assert str(path) in out
        assert path.read_bytes()[:8] == PNG_MAGIC and 1_000 < path.stat().st_size < 100_000


def test_every_picture_is_committed_and_shown_in_its_chapter():
    for picture in PICTURES:
        relative = f"pictures/{picture.name}.png"
        assert (TUTORIALS / picture.chapter / relative).is_file(), f"run: python -m tutorials.pictures {picture.name}"
        assert f"]({relative})" in (TUTORIALS / picture.chapter / "README.md").read_text()


def test_an_unknown_picture_is_named_in_the_error(capsys):
    from tutorials.pictures import main
    with pytest.raises(SystemExit):
        main(["mesh_grid", "no_such_picture"])
    assert "unknown picture(s) no_such_picture; choose from autograd_graph, train_loss" in capsys.readouterr().err


def test_every_chapter_has_a_picture_and_chapter_selects_them(capsys):
    chapters = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*"))
    assert sorted({p.chapter for p in PICTURES}) == chapters
    cli.main(["--list", "--chapter", "14", "8"])
    listed = capsys.readouterr().out.split()
    assert listed[::2] == ["gpipe_vs_1f1b", "interleaved", "zero_bytes", "prefetch"]
    with pytest.raises(SystemExit):
        cli.main(["--chapter", "99"])
    assert "no pictures in chapter(s) 99" in capsys.readouterr().err


def test_new_pictures_have_their_text_form_without_matplotlib():
    out = pictures_command("--chapter", "01", "16", "19", hide_matplotlib=True)
    assert "=== 01_autograd: autograd_graph" in out and "backward visits: Sum -> Softplus" in out
    assert "=== 16_context_parallel: ring_rotation" in out and "rank 0 holds K/V of rank 0" in out
    assert "=== 19_finding_the_strategy: sharded_block" in out and ".png" not in out


def test_an_out_that_is_a_file_is_refused_before_any_picture_is_computed(tmp_path, monkeypatch, capsys):
    import tutorials.pictures as pictures

    def must_not_run(quick):
        raise AssertionError("a picture was computed before --out was checked")

    monkeypatch.setattr(cli, "PICTURES", [replace(pictures.PICTURES[0], compute=must_not_run)])
    monkeypatch.setattr(cli, "pyplot", lambda: object())  # drawing, with or without matplotlib here
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        pictures.main([pictures.PICTURES[0].name, "--out", str(tmp_path / "file")])
    assert exit_info.value.code == 2 and (tmp_path / "file").read_text() == "mine"
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"--out {tmp_path / 'file'} is a file: give a directory (each picture goes to OUT/<chapter>/pictures/<name>.png)")
