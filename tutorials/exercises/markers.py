"""Exercise markers: find the fenced regions of the library, check them, and turn them into stubs.

A fence is two comment lines inside a function body, at the indentation of the lines
between them (the lines a learner writes):

        # exercise 05.2: column-parallel forward
        # hint: enter the parallel region (f), apply this rank's rows of the weight ...
        y = self.local(enter_column_parallel(x, self.group, self.sequence_parallel))
        return gather_from_tensor_model_parallel_region(y, self.group) if self.gather_output else y
        # end exercise

`05` is the tutorial chapter, `2` the exercise in it. One exercise may have several
fences (f's backward and g's forward are one exercise); they share the title. The stub
keeps the marker and hint lines and puts one `raise NotImplementedError(...)` where the
code was, so the module still imports and only the exercise's own code path fails.
"""
import ast
import re
from dataclasses import dataclass
from pathlib import Path

START = re.compile(r"^(?P<indent>[ \t]*)# exercise (?P<id>(?P<chapter>\d\d)\.\d+): (?P<title>\S.*?)\s*$")
END = re.compile(r"^[ \t]*# end exercise\s*$")
HINT = re.compile(r"^[ \t]*# hint: ?(?P<text>.*?)\s*$")
SOURCE_DIRS = ("minitensor", "parallel")  # where fences live


class MarkerError(ValueError):
    """A fence that cannot become a stub; the message names the file and line."""


@dataclass(frozen=True)
class Fence:
    """One fenced region: lines[start] is the marker, lines[end] the end marker (0-based)."""
    path: str  # relative to the checkout root, with forward slashes
    id: str
    title: str
    start: int
    end: int
    indent: str
    hint_lines: tuple  # the text of the `# hint:` lines

    @property
    def hint(self):
        return " ".join(self.hint_lines)

    def body(self, lines):
        """The lines between the markers, hint lines included."""
        return lines[self.start + 1:self.end]

    def stub_lines(self):
        """The hint lines and the `raise` that replace the body."""
        message = f"exercise {self.id}: {self.title}" + (f". Hint: {self.hint}" if self.hint else "")
        hints = [f"{self.indent}# hint: {line}" for line in self.hint_lines]
        return hints + [f"{self.indent}raise NotImplementedError({message!r})"]


def find_fences(text, path):
    """The fences of one file's `text`, in order; a malformed fence raises MarkerError."""
    lines = text.split("\n")
    fences, open_at = [], None
    for number, line in enumerate(lines):
        start = START.match(line)
        if start and open_at is not None:
            raise MarkerError(f"{path}:{number + 1}: exercise {start['id']} starts inside the fence "
                              f"opened at line {open_at.start() + 1}; close that one first with '# end exercise'")
        if start:
            open_at, opened = start, number
        elif END.match(line):
            if open_at is None:
                raise MarkerError(f"{path}:{number + 1}: '# end exercise' without an opening '# exercise NN.k: title'")
            fences.append(_fence(lines, path, open_at, opened, number))
            open_at = None
        elif re.match(r"^\s*# exercise\b", line) or re.match(r"^\s*# end exercise", line):
            raise MarkerError(f"{path}:{number + 1}: malformed marker {line.strip()!r}; "
                              f"write '# exercise NN.k: title' ... '# end exercise'")
    if open_at is not None:
        raise MarkerError(f"{path}:{opened + 1}: exercise {open_at['id']} has no '# end exercise'")
    return fences


def _fence(lines, path, match, start, end):
    indent = match["indent"]
    if not lines[end].startswith(indent) or lines[end][len(indent):len(indent) + 1] in (" ", "\t"):
        raise MarkerError(f"{path}:{end + 1}: '# end exercise' must have the indentation of its opening "
                          f"marker at line {start + 1}")
    hints = tuple(h["text"] for h in map(HINT.match, lines[start + 1:end]) if h)
    return Fence(path, match["id"], match["title"], start, end, indent, hints)


def check_fences(text, path, fences):
    """Every fence must hold whole statements of one block inside a function body, at the
    marker's indentation, so that its stub is valid Python; else MarkerError naming the line."""
    tree = ast.parse(text, filename=path)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    for fence in fences:
        first, last = fence.start + 2, fence.end  # 1-based lines strictly between the markers
        where = f"{path}:{fence.start + 1}: exercise {fence.id}"
        inside = [s for s in statements if first <= s.lineno and s.end_lineno <= last]
        if not inside:
            raise MarkerError(f"{where}: the fence holds no statement")
        first = min(s.lineno for s in inside)  # past the hint lines
        for s in statements:
            cut = s.lineno <= last and s.end_lineno >= first and s not in inside
            if cut and not (s.lineno < first and s.end_lineno >= last and _has_block_around(s, first, last)):
                raise MarkerError(f"{where}: the fence cuts the statement at line {s.lineno}; "
                                  f"fence whole statements")
        top = min(inside, key=lambda s: (s.lineno, s.col_offset))
        if not _in_function(top, parent):
            raise MarkerError(f"{where}: a fence must sit inside a function or method body "
                              f"(its stub is a `raise` in that body)")
        if top.col_offset != len(fence.indent):
            raise MarkerError(f"{where}: the marker's indentation ({len(fence.indent)}) differs from "
                              f"the fenced code's ({top.col_offset})")


def _in_function(node, parent):
    while node in parent:
        node = parent[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
    return False


def _has_block_around(statement, first, last):
    """`statement` is compound and one of its blocks holds lines first..last."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        block = getattr(statement, field, None)
        if block and block[0].lineno <= first and last <= block[-1].end_lineno:
            return True
    return False


def stub_text(text, fences):
    """`text` with the bodies of `fences` (all of this file) replaced by their stubs."""
    lines = text.split("\n")
    for fence in sorted(fences, key=lambda f: f.start, reverse=True):
        lines[fence.start + 1:fence.end] = fence.stub_lines()
    return "\n".join(lines)


def replace_body(text, fence, new_body):
    """`text` (the file `fence` was found in) with the fence's body replaced by the lines `new_body`."""
    lines = text.split("\n")
    lines[fence.start + 1:fence.end] = new_body
    return "\n".join(lines)


def library_fences(root):
    """{path: (text, fences)} for every library file under `root` with fences, each checked."""
    found = {}
    for directory in SOURCE_DIRS:
        for file in sorted((Path(root) / directory).rglob("*.py")):
            text = file.read_text()
            if "# exercise " not in text and "# end exercise" not in text:
                continue
            path = file.relative_to(root).as_posix()
            fences = find_fences(text, path)
            check_fences(text, path, fences)
            found[path] = (text, fences)
    return found


def exercises(root):
    """{id: [Fence, ...]} over the library under `root`, ids in order; one title per id."""
    by_id = {}
    for _, fences in library_fences(root).values():
        for fence in fences:
            by_id.setdefault(fence.id, []).append(fence)
    for id, fences in by_id.items():
        titles = {f.title for f in fences}
        if len(titles) > 1:
            raise MarkerError(f"exercise {id} has fences with different titles {sorted(titles)} "
                              f"({', '.join(f'{f.path}:{f.start + 1}' for f in fences)})")
    return dict(sorted(by_id.items(), key=lambda item: tuple(map(int, item[0].split(".")))))
