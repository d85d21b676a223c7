"""`python -m tutorials.pictures [names] [--chapter NN ...] [--out DIR] [--text] [--quick] [--list]`."""
import argparse
import io
import time
from pathlib import Path

from . import communication, experts, flash, foundations, fp8, layouts, pipelines, search, staleness
from .draw import DPI, TUTORIALS

PICTURES = [*foundations.PICTURES, *layouts.PICTURES, *pipelines.PICTURES, *communication.PICTURES,
            *staleness.PICTURES, *search.PICTURES, *experts.PICTURES, *flash.PICTURES, *fp8.PICTURES]
PICTURES.sort(key=lambda p: p.chapter)  # stable: a chapter's pictures keep their order


def pyplot():
    """matplotlib.pyplot (drawing to files only), or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_small(plt, figure, path):
    """PNG with a palette of at most 64 colours: flat-coloured plots lose nothing and shrink
    several-fold (Pillow comes with matplotlib)."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI)
    plt.close(figure)
    Image.open(buffer).convert("RGB").quantize(64).save(path, optimize=True)


def out_problem(out, pictures):
    """Why `pictures` cannot be written under `out` (one line), or None, their folders made."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file: give a directory (each picture goes to OUT/<chapter>/pictures/<name>.png)"
    try:
        for picture in pictures:
            (out / picture.chapter / "pictures").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"--out {out}: cannot make {error.filename} ({error.strerror}): give a directory you can write"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.pictures",
                                     description="The chapters' pictures, drawn from the numbers their scripts print.")
    parser.add_argument("names", nargs="*", help="pictures to make (default: all; --list names them)")
    parser.add_argument("--chapter", nargs="+", default=[], metavar="NN",
                        help="only the pictures of these chapters (01 ... 21)")
    parser.add_argument("--out", type=Path, default=TUTORIALS,
                        help="write OUT/<chapter>/pictures/<name>.png (default: the tutorials folder)")
    parser.add_argument("--text", action="store_true", help="print the text form instead of drawing")
    parser.add_argument("--quick", action="store_true", help="short runs (for the tests; not committed)")
    parser.add_argument("--list", action="store_true", help="list the pictures and exit")
    args = parser.parse_args(argv)
    chosen = {p.name: p for p in PICTURES}
    unknown = [n for n in args.names if n not in chosen]
    if unknown:
        parser.error(f"unknown picture(s) {', '.join(unknown)}; choose from {', '.join(chosen)}")
    chapters = {p.chapter[:2] for p in PICTURES}
    wanted = {c.zfill(2) for c in args.chapter}
    if wanted - chapters:
        parser.error(f"no pictures in chapter(s) {', '.join(sorted(wanted - chapters))}; "
                     f"chapters with pictures: {', '.join(sorted(chapters))}")
    pictures = [chosen[n] for n in args.names] or [p for p in PICTURES if not wanted or p.chapter[:2] in wanted]
    if args.list:
        for p in pictures:
            print(f"{p.name:<22} {p.chapter}/pictures/{p.name}.png")
        return
    plt = None if args.text else pyplot()
    if plt is None and not args.text:
        print("matplotlib is not installed (pip install -e '.[plots]'): printing each picture's text form")
    problem = out_problem(args.out, pictures) if plt else None  # before anything is computed
    if problem:
        parser.error(problem)
    for picture in pictures:
        start = time.perf_counter()
        data, text = picture.compute(args.quick)
        if plt is None:
            print(f"\n=== {picture.chapter}: {picture.name}\n{text.rstrip()}")
            continue
        path = args.out / picture.chapter / "pictures" / f"{picture.name}.png"
        save_small(plt, picture.draw(plt, data), path)
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB, {time.perf_counter() - start:.1f} s)")
