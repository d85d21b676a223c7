"""How `python -m parallel.train` fails: one line, the whole job ended, a non-zero exit.

An error on one MPI rank must end every rank: the others are waiting for it in
a collective. So the entry point runs `main()` under `run_job`, which catches
whatever it raises, prints it as one line on stderr, naming the rank,

    python -m parallel.train: error: rank 0 of 2: FileExistsError: [Errno 17] File exists: 'ckpt'

and ends the job with `Group.abort` (MPI_Abort under MPI, which stops every
rank; exit status 1). This works with or without `python -m mpi4py`.

User errors get no traceback: a value that cannot work (ValueError, and so
CheckpointError), a path that cannot be read or written (OSError), and a rank
that stopped answering (CommTimeout, whose message names the operation and the
group). Anything else is a bug in this code: its traceback is printed first.
`--debug` (or PARALLEL_DEBUG=1) prints the traceback of every error, and under
MPI checks that every rank makes the same collective call (parallel/comm/debug.py).

Each rank also writes its line to DIR/rank_NNNNN.error (DIR: --log-dir, else --save), at
once, before anything that could block: a rank cut off from the launcher (a host whose
network went down) loses what it prints, because Hydra carries it, but not this file; the
printed line says where the files are. Under MPI a rank whose MPI_Abort cannot reach the
launcher would wait on it, so ABORT_GRACE_S later it exits by itself.

When every rank fails alike (say, a checkpoint directory that already exists),
only rank 0's line should appear: the other ranks wait REPORT_DELAY_S before
printing, time for rank 0's abort to end them first. Ranks cannot agree on who
failed first once one has failed, so this is best effort. (The start-up checks need no
guess: they communicate nothing, so the ranks agree on their verdict by an all-gather.)
"""
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from ..comm import CommTimeout, world
from ..comm.checks import check_timeout, default_debug, default_timeout

USER_ERRORS = (ValueError, OSError, CommTimeout)
REPORT_DELAY_S = 5.0  # only spent when rank 0 did not fail: its abort ends the others first
ABORT_GRACE_S = 10.0  # an MPI rank whose MPI_Abort has not ended it by then exits by itself
PROG = "python -m parallel.train"
_error_dir = [None]  # where each rank writes its error line (log_errors_to)


def log_errors_to(directory):
    """From now on a failing rank also writes its one-line error into `directory` (None: nowhere)."""
    _error_dir[0] = Path(directory) if directory else None


def write_error_file(line, group):
    """The line into DIR/rank_NNNNN.error; the note the printed line ends with ("" without a DIR)."""
    directory = _error_dir[0]
    if directory is None:
        return ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"rank_{group.rank:05d}.error").write_text(line + "\n")
    except OSError as error:
        return f" (could not write {directory}/rank_{group.rank:05d}.error: {error.strerror or error})"
    return f" (every failing rank's line is in {directory}/rank_*.error)"


def seconds(text):
    """argparse type of --timeout: a positive number of seconds."""
    return check_timeout(text, "--timeout")


def configure_world(args):
    """This rank's world with --timeout and --debug (else $PARALLEL_TIMEOUT, $PARALLEL_DEBUG) applied;
    the groups split from it inherit them."""
    return world(timeout=args.timeout or default_timeout(), debug=args.debug or default_debug())


def one_line(exc, group):
    """The error as one line: where (the rank, or run_threads' note), the exception's type and message."""
    where = f"rank {group.rank} of {group.size}: " if group.size > 1 else ""
    notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", []))
    message = " ".join(str(exc).split())  # one line, whatever the message holds
    return f"{PROG}: error: {where}{type(exc).__name__}: {message}{notes}"


def run_job(main, argv=None):
    """Run main(argv); on any exception print one line (and a traceback for bugs or --debug) and abort."""
    try:
        main(argv)
    except SystemExit:
        raise  # argparse: --help, or a flag error already printed on every rank
    except BaseException as exc:  # noqa: BLE001 - every error ends the job
        group = world()
        line = one_line(exc, group)
        where = write_error_file(line, group)
        if group.rank > 0:
            time.sleep(REPORT_DELAY_S)
        if group.debug or not isinstance(exc, USER_ERRORS + (KeyboardInterrupt,)):
            traceback.print_exception(exc)
        print(line + where, file=sys.stderr, flush=True)
        sys.stdout.flush()
        abort(group, 130 if isinstance(exc, KeyboardInterrupt) else 1)


def abort(group, code):
    """End the job (group.abort); an MPI rank that is still alive ABORT_GRACE_S later (its
    MPI_Abort cannot reach the launcher) exits by itself."""
    if group.backend == "mpi":
        watchdog = threading.Timer(ABORT_GRACE_S, os._exit, (code,))
        watchdog.daemon = True
        watchdog.start()
    group.abort(code)
