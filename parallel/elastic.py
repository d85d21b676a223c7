"""python -m parallel.elastic: a training job that loses a rank goes on with the ranks that remain.

    python -m parallel.elastic --ranks 4 --min-ranks 2 --max-restarts 3 -- \\
        --dp 4 --batch 8 --steps 100 --save ckpt --save-every 1 [other parallel.train flags]
    python -m parallel.launch --elastic ...      (the same)

The agent (torchrun's elastic agent, for one MPICH host) runs the job as
`mpiexec -disable-auto-cleanup -n N python -m parallel.train FLAGS --log-dir DIR`, where each
failing rank writes its one line to DIR/rank_NNNNN.error (parallel.train.errors). A rank
stopped (SIGSTOP, a hung host) leaves the others waiting --timeout in their next collective:
they fail with a CommTimeout, write their line and abort the job, which ends the stopped one.
A rank killed outright (kill -9, a crashed process) ends the whole job at once (Hydra), and no
rank writes a line. So after a failure:

    lost ranks       those that left no line while others did (stopped past --timeout); one,
                     not known which, when no rank left a line (killed)
    restart          when ranks were lost, or every line is a CommTimeout (a transient fault:
                     the same number of ranks), from the latest checkpoint in --save DIR,
                     resharded to the new layout by --resume (any layout loads any checkpoint)
    new layout       tp, pp, cp, ep kept; dp the largest that the remaining ranks hold, that ep
                     divides and that keeps the global --batch with the same micro-batch size
                     (more micro-batches per replica): the same optimizer steps, on fewer ranks
    stop (exit 1)    a failure that is not a lost rank or a timeout (a bug or bad input: its
                     line is shown), fewer than --min-ranks left, --max-restarts restarts done,
                     or a failure again at the step resumed from (nothing newer was saved:
                     a fault that repeats deterministically)

The checkpoint a restart resumes from is copied to DIR/elastic/attempt_K/resumed_from (a
run resumed by hand from it reproduces the attempt). Every attempt and restart is a line of the log (when, why, the old and new layout, the step
resumed from) and an event of DIR/elastic.trace.json (chrome://tracing, Perfetto).
Imports nothing of the project but the launcher: it runs no numpy.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .launch import BLAS_THREAD_VARS, find_mpiexec

LAYOUT_FLAGS = ("dp", "tp", "pp", "cp", "ep", "microbatches")
REWRITTEN = ("--dp", "--microbatches", "--resume", "--log-dir", "--overwrite")
TIMEOUT = "CommTimeout"


def train_flags(flags):
    """The flags the agent reads from the train command; a ValueError naming what it needs."""
    parser = argparse.ArgumentParser(add_help=False)
    for name in LAYOUT_FLAGS:
        parser.add_argument(f"--{name}", type=int, default=1)
    for name in ("batch", "save_every", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    parser.add_argument("--save")
    known, _ = parser.parse_known_args(flags)
    if known.threads is not None:
        raise ValueError(f"--threads {known.threads}: threads of one process are lost together; the agent restarts "
                         f"MPI ranks (give the layout without --threads)")
    for flag, value in (("--save DIR", known.save), ("--save-every N", known.save_every), ("--batch", known.batch)):
        if value is None:
            raise ValueError(f"the train command needs {flag}: the agent resumes from its checkpoints at a new layout")
    return known


def shrink(layout, batch, ranks):
    """(dp, micro-batches) on at most `ranks` ranks: tp·pp·cp kept, dp the largest that ep divides
    and that keeps the micro-batch size batch / (dp·micro-batches); None if none fits."""
    cell = layout.tp * layout.pp * layout.cp
    micro = batch // (layout.dp * layout.microbatches)
    for dp in range(min(layout.dp, ranks // cell), 0, -1):
        if dp % layout.ep == 0 and batch % (dp * micro) == 0:
            return dp, batch // (dp * micro)
    return None


def failure(log_dir, world):
    """(lost ranks, the lines of the others) after a failed attempt. A job that ended without any
    rank's line lost one rank, which is not known: Hydra ends every rank at once when one is
    killed (MPICH 5 even under -disable-auto-cleanup), so the count is one, the rank "?"."""
    lines = {r: (log_dir / f"rank_{r:05d}.error").read_text().strip() for r in range(world)
             if (log_dir / f"rank_{r:05d}.error").is_file()}
    return [r for r in range(world) if r not in lines] if lines else ["?"], lines


def verdict(lost, lines, ranks, step, history, args):
    """Why the agent stops (one line), or None to restart on `ranks - len(lost)` ranks."""
    if not lost and not all(TIMEOUT in line for line in lines.values()):
        bad = next(line for line in lines.values() if TIMEOUT not in line)
        return f"a failure that is not a lost rank or a timeout, so a restart would meet it again: {bad}"
    if ranks - len(lost) < args.min_ranks:
        return f"{ranks - len(lost)} rank(s) remain, fewer than --min-ranks {args.min_ranks}"
    if len(history) > args.max_restarts:
        return f"--max-restarts {args.max_restarts} restarts done"
    if step is not None and step in history[:-1]:
        return f"the job failed again after resuming from {step} with nothing newer saved: a fault that repeats"
    return None


def latest_step(save):
    pointer = Path(save) / "latest"
    return pointer.read_text().strip() if pointer.is_file() else None


def command(flags, dp, microbatches, save, log_dir, ranks, resume):
    kept, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag.split("=")[0] in REWRITTEN:
            skip = "=" not in flag and flag != "--overwrite"
        else:
            kept.append(flag)
    return [find_mpiexec(), "-disable-auto-cleanup", "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m",
            "parallel.train", *kept, "--dp", str(dp), "--microbatches", str(microbatches), "--log-dir", str(log_dir),
            *(["--resume", str(save)] if resume else [])]


class Trace:
    """Chrome trace events of the attempts (spans) and restarts (instants), rewritten after each."""

    def __init__(self, path):
        self.path, self.events, self.start = path, [], time.time()

    def add(self, name, begin, end=None, **details):
        event = {"name": name, "ph": "X" if end else "i", "ts": (begin - self.start) * 1e6, "pid": 0, "tid": 0,
                 "args": details, **({"dur": (end - begin) * 1e6} if end else {"s": "g"})}
        self.events.append(event)
        self.path.write_text(json.dumps({"traceEvents": self.events}))


def rank_after_step(agent, save, step, rank, timeout=240):
    """The pid of MPI rank `rank` of `agent`'s running job once checkpoint `step` is in `save`, or None
    if the job ended first: how a test or a demonstration picks its moment to stop a rank (the step
    the job has reached by then depends on the machine's load: later checkpoints may exist)."""
    deadline, pid, saved = time.monotonic() + timeout, None, Path(save) / f"step_{step:06d}"
    while time.monotonic() < deadline and agent.poll() is None:
        pid = pid or rank_pid(agent.pid, rank)  # found first: a scan of /proc takes longer than a tiny job's step
        if pid is not None and saved.is_dir():
            return pid
        time.sleep(0.01)
    return None


def rank_pid(root, rank):
    """The pid of MPI rank `rank` of parallel.train among process `root`'s descendants (its
    PMI_RANK), or None: how a test or a demonstration finds the rank to kill."""
    children = {}
    for proc in Path("/proc").iterdir():
        try:
            children.setdefault(int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    stack = [root]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            environ, cmdline = (Path(f"/proc/{pid}/{name}").read_bytes() for name in ("environ", "cmdline"))
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in environ.split(b"\0") and b"parallel.train" in cmdline:
            return pid
    return None


def say(line):
    print(f"elastic {time.strftime('%H:%M:%S')}: {line}", flush=True)


def run(args, flags):
    layout = train_flags(flags)
    save, ranks = Path(layout.save), args.ranks
    dp, microbatches, history = layout.dp, layout.microbatches, []
    root = save / "elastic"
    root.mkdir(parents=True, exist_ok=True)
    trace = Trace(save / "elastic.trace.json")
    env = dict(os.environ, **{var: "1" for var in BLAS_THREAD_VARS})
    cell = layout.tp * layout.pp * layout.cp
    while True:
        log_dir, resume, world = root / f"attempt_{len(history)}", latest_step(save), dp * cell
        name = f"attempt {len(history)}: {world} of {ranks} ranks, dp {dp} x {microbatches} micro-batches"
        say(f"{name}{f', resuming from {resume}' if resume else ''}")
        begin = time.time()
        code = subprocess.run(command(flags, dp, microbatches, save, log_dir, world, resume), env=env).returncode
        trace.add(name, begin, time.time(), exit=code, resumed_from=resume)
        if code == 0:
            say(f"the job finished ({len(history)} restart(s))")
            return 0
        lost, lines = failure(log_dir, world)
        step = latest_step(save)
        history.append(step)
        why = "exit 2: a bad flag" if code == 2 else verdict(lost, lines, ranks, step, history, args)
        shrunk = None if why else shrink(layout.__class__(**{**vars(layout), "dp": dp, "microbatches": microbatches}),
                                         layout.batch, ranks - len(lost))
        if why is None and shrunk is None:
            why = f"no dp fits {ranks - len(lost)} ranks with tp·pp·cp = {cell} and --batch {layout.batch}"
        if why:
            say(f"stopping: {why}")
            return 1
        ranks -= len(lost)
        cause = f"rank(s) {lost} lost" if lost else "every rank timed out (transient)"
        say(f"restart {len(history)}: {cause}; dp {dp} x {microbatches} -> dp {shrunk[0]} x {shrunk[1]} "
            f"micro-batches ({ranks} ranks left), global batch {layout.batch} kept; resuming from {step}")
        trace.add(f"restart {len(history)}", time.time(), why=cause, old=[dp, microbatches], new=list(shrunk),
                  resumed_from=step)
        if step:  # kept beside the next attempt's log: pruning may delete it from --save once it trains on
            shutil.copytree(save / step, root / f"attempt_{len(history)}" / "resumed_from" / step)
        dp, microbatches = shrunk


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m parallel.elastic", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, required=True, help="MPI ranks to start with (dp·tp·pp·cp)")
    parser.add_argument("--min-ranks", type=int, default=1, metavar="K", help="stop when fewer remain")
    parser.add_argument("--max-restarts", type=int, default=3, metavar="R", help="stop after R restarts")
    args = parser.parse_args(argv[:split])
    if not 1 <= args.min_ranks <= args.ranks or args.max_restarts < 0:
        parser.error(f"--min-ranks {args.min_ranks} must be in [1, --ranks {args.ranks}] and --max-restarts "
                     f"{args.max_restarts} ≥ 0")
    if find_mpiexec() is None:
        parser.error(f"no mpiexec next to {sys.executable} or on PATH (pip install mpich)")
    try:
        return run(args, argv[split + 1:])
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    sys.exit(main())
