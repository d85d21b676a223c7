"""The numbers the chapter READMEs quote are the numbers the scripts print (tutorials/claims.py).

The everyday test runs `python -m tutorials.claims --check` on a few fast chapters (each script
once, seconds each); the `deep` test runs it on every chapter. The format itself is pinned on a
README and a script written here: a changed number is found, named by file and line, and
`--update` writes the script's number back, keeping a right-aligned column aligned.
"""
import subprocess
import sys
import textwrap

import pytest
from mpi_launch import REPO

FAST_CHAPTERS = ["01", "03", "04", "05", "06", "11", "14", "15", "16", "20"]  # ~25 s together on a 2-core machine


def claims(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tutorials.claims", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_the_fast_chapters_quote_what_their_scripts_print():
    done = claims("--check", *FAST_CHAPTERS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 numbers differ, 0 lines not found" in done.stdout


@pytest.mark.deep  # every chapter's scripts: minutes; .ci/run runs it (pytest -m deep)
def test_every_chapter_quotes_what_its_scripts_print():
    done = claims("--check", timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr


SCRIPT = """\
print("table:")
print("nodes      27   bytes    3,248,400")
print("step 1: loss 2.50")
print("step 2: loss 2.25")
print("ratio 0.713x, time 12.5 ms")
"""


def write_chapter(tmp_path, quoted_bytes, quoted_loss, quoted_ratio, quoted_time):
    (tmp_path / "demo.py").write_text(SCRIPT)
    readme = tmp_path / "README.md"
    readme.write_text(textwrap.dedent(f"""\
        # demo

        <!-- claim: demo.py -->
        ```
        nodes      27   bytes    {quoted_bytes}
        ...
        step 2: loss {quoted_loss}
        ```

        It falls to <!-- claim: demo.py | ratio {{}}x -->{quoted_ratio}x in <!-- claim: demo.py | time {{}} ms | timing -->{quoted_time} ms.
        """))
    return readme


def test_a_quoted_number_that_differs_is_named_and_update_writes_the_printed_one(tmp_path):
    readme = write_chapter(tmp_path, "  999,999", "2.30", "0.800", "99.0")
    done = claims("--check", str(readme))
    assert done.returncode == 1
    assert "README.md:5: differs: 999,999 -> 3,248,400" in done.stdout
    assert "README.md:7: differs: 2.30 -> 2.25" in done.stdout   # step 2's line, not step 1's
    assert "README.md:10: differs: 0.800 -> 0.713" in done.stdout
    assert "timing, reported only: 99.0 -> 12.5" in done.stdout
    assert "3 numbers differ" in done.stdout

    assert claims("--update", str(readme)).returncode == 0
    text = readme.read_text()
    assert "nodes      27   bytes    3,248,400\n" in text          # the column stays right-aligned
    assert "step 2: loss 2.25" in text and "-->0.713x in" in text
    assert "-->99.0 ms" in text                                   # timing: rewritten only with --timing
    assert claims("--check", str(readme)).returncode == 0


def test_a_quoted_line_the_script_no_longer_prints_fails(tmp_path):
    readme = write_chapter(tmp_path, "3,248,400", "2.25", "0.713", "12.5")
    assert claims("--check", str(readme)).returncode == 0
    readme.write_text(readme.read_text().replace("step 2: loss", "step 2: the loss"))
    done = claims("--check", str(readme))
    assert done.returncode == 1 and "README.md:7: no output line reads as: step 2: the loss 2.25" in done.stdout


def test_a_malformed_claim_is_refused_with_its_line(tmp_path):
    readme = write_chapter(tmp_path, "3,248,400", "2.25", "0.713", "12.5")
    readme.write_text(readme.read_text().replace("<!-- claim: demo.py -->", "<!-- claim: nowhere.py -->"))
    done = claims("--check", str(readme))
    assert done.returncode == 2 and "README.md:3: no script nowhere.py" in done.stdout
