"""Quoted numbers that cannot drift: every number a chapter README quotes from a script is a *claim*.

    python -m tutorials.claims --check [CHAPTER ...]   re-run the scripts; exit 1 on any quoted number that differs
    python -m tutorials.claims --update [CHAPTER ...]  rewrite the quoted numbers in the READMEs from the scripts
    python -m tutorials.claims --list [CHAPTER ...]    the claims: README line, command, kind, count of numbers
    add --timing to also run the scripts that only timing claims use (reported, never failed)

CHAPTER is a number (`18`) or a README path; none means every tutorials/NN_*/README.md.

A claim is an HTML comment in a README (invisible when the Markdown is rendered), in one of two forms.

**A quoted block**: the comment alone on the line before a fenced block that quotes a script's output.

    <!-- claim: rewrite_and_fuse.py --gpt none -->
    ```
    traced                                 nodes  27  bytes moved    3,248,400  saved bytes     922,792
    ...
    ```

Every line of the block that holds a number is a line of the script's output: the check finds the
output line with the same text around the numbers (runs of spaces match any run of spaces, `...` in
the quoted line matches any text) and compares the numbers one by one. Of several such output lines it
takes the one that agrees on most numbers (`step  7: ...` is the output's step 7 even when the loss
changed), then the first after the previous quoted line's match (repeated lines go by their order). Lines without a number
(and the `...` lines that stand for omitted ones) are not checked.

**An inline number**: the comment right before the number (outside any `code span`, where a comment would
show), with a template: the output text around it, `{}` where the number stands, `...` for any text (the
first output line matching the template gives it). Never start a line with an inline claim: Markdown
would take the line for an HTML block.

    Bytes moved fall to <!-- claim: rewrite_and_fuse.py | medium GPT: bytes moved {}x -->0.895x of the traced graph.

The command comes first: a script in the README's chapter folder with its arguments
(`ring.py --threads 4`), a path from the repository root (`tutorials/09_3d/compose.py ...`), or
`-m module args`. It runs with this Python from the repository root, with one BLAS thread, once per
`--check` however many claims quote it. Options follow, each after a ` | ` (spaces around the bar, so a
regular expression may hold a bare `|`):

    tol R          relative tolerance (default 0: the printed digits must match); |a - b| <= atol + R * max(|a|, |b|)
    atol A         absolute tolerance (default 0)
    timing         a measurement (seconds, a loaded machine's bandwidth): reported when it differs, never failed,
                   and not rewritten by --update unless --timing is given
    timing /RE/    in a block: only the quoted lines matching the regular expression RE are timing
    ignore /RE/    in a block: quoted lines matching RE are not checked (a command line, an elided path)
    TEXT {} TEXT   the template of an inline claim

Two numbers both below ROUNDOFF (1e-9) in magnitude agree, zero included: they are round-off (a largest
difference to one device of 4.4e-16 here may be 6.7e-16, or 0, with another CPU's BLAS), and the claim is
that they are that small. Numbers are what they look like in the text: `1,263,112`, `-0.5`, `8.7e-16`, `0.713x` (the 0.713), `nan`,
`inf`; digits inside names (`linear_0`, `blocks.0.attn`, `fp16`) are not numbers. `--update` writes the
number as the script printed it, keeping right-aligned columns aligned; it re-reads each README just
before writing and changes only lines that still read as they did (other people edit the READMEs too).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"

_NUM = (r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]*\d)"
        r"|(?<![\w.])[-+]?(?:nan|inf)(?!\w)")
NUMBER = re.compile(_NUM)
_MARKER = re.compile(r"<!--\s*claim:\s*(.*?)\s*-->")
_FENCE = re.compile(r"^\s*```")


def value(token):
    return float(token.replace(",", ""))


ROUNDOFF = 1e-9  # below it a quoted number says "zero, to rounding": 4.4e-16 here may be 6.7e-16 on another CPU


def same(a, b, tol, atol):
    x, y = value(a), value(b)
    if x == y or (x != x and y != y):
        return True
    if x in (float("inf"), float("-inf")) or y in (float("inf"), float("-inf")) or x != x or y != y:
        return False
    if abs(x) < ROUNDOFF and abs(y) < ROUNDOFF:
        return True
    return abs(x - y) <= atol + tol * max(abs(x), abs(y))


@dataclass
class Claim:
    readme: Path
    line: int                       # 0-based index of the marker line
    command: tuple                  # argv after the python executable
    kind: str                       # "block" or "inline"
    tol: float = 0.0
    atol: float = 0.0
    timing: bool = False
    timing_lines: list = field(default_factory=list)  # regexes
    ignore_lines: list = field(default_factory=list)
    template: str = ""
    quoted: list = field(default_factory=list)         # block: [(line index, text)]; inline: [(line index, text)]

    def where(self, index=None):
        return f"{rel(self.readme)}:{(self.line if index is None else index) + 1}"


class ClaimError(ValueError):
    pass


def rel(path):
    """`path` from the repository root when it is inside it (as messages name files), else absolute."""
    path = Path(path).resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def command_argv(text, chapter):
    words = shlex.split(text)
    if not words:
        raise ClaimError("a claim names no command")
    if words[0] == "-m":
        return tuple(words)
    script = words[0]
    path = ROOT / script if script.startswith("tutorials/") else chapter / script
    if not path.exists():
        raise ClaimError(f"no script {script} (looked for {rel(path)})")
    return (str(rel(path)), *words[1:])


def regex_option(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == "/" and text[-1] == "/":
        return re.compile(text[1:-1])
    raise ClaimError(f"expected /regular expression/, got {text!r}")


def parse_marker(body, readme, line, kind):
    command, *options = [part.strip() for part in re.split(r"\s\|\s", f" {body} ")]
    claim = Claim(readme, line, command_argv(command, readme.parent), kind)
    for option in options:
        key, _, rest = option.partition(" ")
        if "{}" in option:
            claim.template = option
        elif key == "tol":
            claim.tol = float(rest)
        elif key == "atol":
            claim.atol = float(rest)
        elif key == "timing" and not rest.strip():
            claim.timing = True
        elif key == "timing":
            claim.timing_lines.append(regex_option(rest))
        elif key == "ignore":
            claim.ignore_lines.append(regex_option(rest))
        else:
            raise ClaimError(f"unknown option {option!r}")
    if kind == "inline" and claim.template.count("{}") != 1:
        raise ClaimError("an inline claim needs a template with one {}: '| text {} text'")
    return claim


def parse(readme):
    """The claims of one README (raises ClaimError naming the line of a malformed one)."""
    lines = readme.read_text().splitlines()
    claims, in_fence = [], False
    for i, text in enumerate(lines):
        if _FENCE.match(text):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in _MARKER.finditer(text):
            alone = text.strip() == m.group(0)
            try:
                claim = parse_marker(m.group(1), readme, i, "block" if alone else "inline")
                if alone:
                    j = i + 1
                    if j >= len(lines) or not _FENCE.match(lines[j]):
                        raise ClaimError("a claim alone on its line must come right before a ``` block")
                    j += 1
                    while j < len(lines) and not _FENCE.match(lines[j]):
                        claim.quoted.append((j, lines[j]))
                        j += 1
                else:
                    after = text[m.end():]
                    lead = re.match(r"[`*\s]*", after).end()
                    number = NUMBER.match(after, lead)
                    if not number:
                        raise ClaimError("an inline claim must be followed by the number it quotes")
                    claim.quoted.append((i, text))
            except ClaimError as error:
                raise ClaimError(f"{rel(readme)}:{i + 1}: {error}") from None
            claims.append(claim)
    return claims


# --- matching a quoted line to the output ---------------------------------------------------------------

def line_pattern(text):
    """A regex matching an output line that reads as `text` with any numbers where `text` has numbers."""
    text, parts, last = text.strip(), [], 0
    for m in NUMBER.finditer(text):
        parts.append(_literal(text[last:m.start()]))
        parts.append(f"({_NUM})")
        last = m.end()
    parts.append(_literal(text[last:]))
    return re.compile(r"\s*" + "".join(parts) + r"\s*")


def _literal(text):
    out = []
    for piece in re.split(r"(\.\.\.|\s+)", text):
        if piece == "...":
            out.append(".*?")
        elif piece and piece.isspace():
            out.append(r"\s+")
        else:
            out.append(re.escape(piece))
    return "".join(out).replace(r"\s+\s+", r"\s+")


def template_pattern(template):
    before, after = template.split("{}")
    return re.compile(_literal(before) + f"({_NUM})" + _literal(after))


@dataclass
class Difference:
    claim: Claim
    index: int
    quoted: str
    now: str
    timing: bool


def compare(claim, output):
    """(differences, problems, replacements{line index: new text}) of one claim against the output."""
    differences, problems, replacements = [], [], {}
    out_lines = output.splitlines()
    if claim.kind == "inline":
        i, text = claim.quoted[0]
        m = template_pattern(claim.template).search(output)
        marker_end = _marker_end(text, claim)
        lead = re.match(r"[`*\s]*", text[marker_end:]).end() + marker_end
        quoted = NUMBER.match(text, lead)
        if not m:
            problems.append((claim, i, f"no output line matches {claim.template!r}"))
            return differences, problems, replacements
        now = m.group(1)
        if not same(quoted.group(0), now, claim.tol, claim.atol):
            differences.append(Difference(claim, i, quoted.group(0), now, claim.timing))
            replacements[i] = text[:quoted.start()] + now + text[quoted.end():]
        return differences, problems, replacements
    position = 0
    for i, text in claim.quoted:
        numbers = list(NUMBER.finditer(text))
        if not numbers or any(r.search(text) for r in claim.ignore_lines):
            continue
        pattern, found, best = line_pattern(text), None, None
        for k, out_line in enumerate(out_lines):
            m = pattern.fullmatch(out_line)
            if m:  # the line that agrees on most numbers (a step's number picks its step), then the next one
                agree = sum(same(q.group(0), m.group(n + 1), claim.tol, claim.atol) for n, q in enumerate(numbers))
                score = (agree, k >= position, -((k - position) % len(out_lines)))
                if best is None or score > best:
                    best, found, at = score, m, k
        if found:
            position = at + 1
        else:
            problems.append((claim, i, f"no output line reads as: {text.strip()}"))
            continue
        timing = claim.timing or any(r.search(text) for r in claim.timing_lines)
        pairs = [(q, found.group(n + 1)) for n, q in enumerate(numbers)]
        differing = [(q, now) for q, now in pairs if not same(q.group(0), now, claim.tol, claim.atol)]
        for q, now in differing:
            differences.append(Difference(claim, i, q.group(0), now, timing))
        if differing:
            replacements[i] = _replace_numbers(text, [(q, now) for q, now in differing])
    return differences, problems, replacements


def _marker_end(text, claim):
    for m in _MARKER.finditer(text):
        if "{}" in m.group(1) and claim.template in m.group(1):
            return m.end()
    return 0


def _replace_numbers(text, pairs):
    """`text` with each (match, new) number replaced, right-aligned columns kept where spaces allow."""
    out, last = [], 0
    for q, new in sorted(pairs, key=lambda p: p[0].start()):
        before = text[last:q.start()]
        grow = len(new) - len(q.group(0))
        spaces = len(before) - len(before.rstrip(" "))
        if grow > 0 and spaces > 1:
            before = before[:len(before) - min(grow, spaces - 1)]
        elif grow < 0 and spaces > 1:
            before = before + " " * -grow
        out.append(before + new)
        last = q.end()
    out.append(text[last:])
    return "".join(out)


# --- running -----------------------------------------------------------------------------------------------

def run(command, timeout):
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    try:
        done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-8:])
        return None, f"exit {done.returncode}:\n{tail}"
    return done.stdout, None


def readmes(selection):
    every = sorted(TUTORIALS.glob("[0-9][0-9]_*/README.md"))
    if not selection:
        return every
    chosen = []
    for item in selection:
        if item.isdigit():
            found = [p for p in every if p.parent.name.startswith(f"{int(item):02d}_")]
            if not found:
                sys.exit(f"no chapter {item}")
            chosen += found
        else:
            path = Path(item).resolve()
            if not path.exists():
                sys.exit(f"no README {item}")
            chosen.append(path)
    return chosen


def show(command):
    return " ".join(shlex.quote(w) for w in command)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.claims", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="exit 1 on any quoted number that differs")
    what.add_argument("--update", action="store_true", help="rewrite the quoted numbers in the READMEs")
    what.add_argument("--list", action="store_true", help="list the claims")
    parser.add_argument("--timing", action="store_true",
                        help="also run scripts only timing claims quote; --update rewrites timing numbers too")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per script run (default 900)")
    parser.add_argument("chapters", nargs="*", help="chapter numbers or README paths (default: all)")
    args = parser.parse_args(argv)

    try:
        claims = [c for readme in readmes(args.chapters) for c in parse(readme)]
    except ClaimError as error:
        print(f"malformed claim: {error}")
        return 2
    if args.list:
        for c in claims:
            count = len(NUMBER.findall(c.quoted[0][1][_marker_end(c.quoted[0][1], c):])[:1]) if c.kind == "inline" \
                else sum(len(NUMBER.findall(t)) for _, t in c.quoted)
            kind = c.kind + (" timing" if c.timing else "") + (f" tol {c.tol:g}" if c.tol else "")
            print(f"{c.where()}  {kind:<20} {count:>4} numbers  python {show(c.command)}")
        return 0

    deterministic_commands = {c.command for c in claims if not c.timing}
    commands = list(dict.fromkeys(c.command for c in claims
                                  if args.timing or c.command in deterministic_commands))
    outputs, failed = {}, {}
    # one script per core at a time (each runs with one BLAS thread): the whole course in about a
    # minute on 2 cores; a timing claim measured beside another script is only reported anyway
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for command in commands:
            print(f"running python {show(command)}", flush=True)
        for command, (output, failure) in zip(commands, pool.map(lambda c: run(c, args.timeout), commands)):
            outputs[command], failed[command] = output, failure

    differences, problems, edits, not_run = [], [], {}, 0
    for c in claims:
        if c.command not in outputs:
            not_run += 1
            continue
        if outputs[c.command] is None:
            if not c.timing:
                problems.append((c, c.line, f"python {show(c.command)} failed: {failed[c.command]}"))
            continue
        d, p, r = compare(c, outputs[c.command])
        differences += d
        problems += p
        if args.update and any(args.timing or not x.timing for x in d):
            for i, new in r.items():
                old = next(t for j, t in c.quoted if j == i)
                edits.setdefault(c.readme, []).append((i, old, new))

    failing = [d for d in differences if not d.timing]
    by_line = {}
    for d in differences:
        by_line.setdefault((d.claim.where(d.index), d.timing, d.claim.command), []).append(f"{d.quoted} -> {d.now}")
    for (where, timing, command), changes in by_line.items():
        tag = "timing, reported only" if timing else "differs"
        print(f"{where}: {tag}: {', '.join(changes)}  (python {show(command)})")
    for c, i, message in problems:
        print(f"{c.where(i)}: {message}")
    if args.update:
        for readme, changes in edits.items():
            write_edits(readme, changes)
    numbers = sum(1 for c in claims if c.command in outputs)
    print(f"{len(claims)} claims in {len({c.readme for c in claims})} READMEs, {len(commands)} script runs: "
          f"{len(failing)} numbers differ, {len(problems)} lines not found or scripts failed, "
          f"{len(differences) - len(failing)} timing numbers differ (reported only)"
          + (f"; {not_run} timing claims not run (--timing runs them)" if not_run else "")
          + (f"; {numbers} claims checked" if numbers != len(claims) else ""))
    if args.update:
        return 1 if problems else 0
    return 1 if failing or problems else 0


def write_edits(readme, changes):
    """Apply [(line index, old text, new text)] to `readme`, re-read now: a line someone else changed since
    is found again by its old text, or left alone with a warning."""
    lines = readme.read_text().split("\n")
    for i, old, new in changes:
        if i < len(lines) and lines[i] == old:
            lines[i] = new
        elif lines.count(old) == 1:
            lines[lines.index(old)] = new
        else:
            print(f"{rel(readme)}:{i + 1}: changed since it was read; not updated")
            continue
        print(f"{rel(readme)}:{i + 1}: updated")
    readme.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
