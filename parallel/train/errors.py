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

When every rank fails alike (say, a checkpoint directory that already exists),
only rank 0's line should appear: the other ranks wait REPORT_DELAY_S before
printing, time for rank 0's abort to end them first. Ranks cannot agree on who
failed first once one has failed, so this is best effort. (The start-up checks need no
guess: they communicate nothing, so the ranks agree on their verdict by an all-gather.)
"""
import sys
import time
import traceback

from ..comm import CommTimeout, world
from ..comm.checks import check_timeout, default_debug, default_timeout

USER_ERRORS = (ValueError, OSError, CommTimeout)
REPORT_DELAY_S = 5.0  # only spent when rank 0 did not fail: its abort ends the others first
PROG = "python -m parallel.train"


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
        if group.rank > 0:
            time.sleep(REPORT_DELAY_S)
        if group.debug or not isinstance(exc, USER_ERRORS + (KeyboardInterrupt,)):
            traceback.print_exception(exc)
        print(one_line(exc, group), file=sys.stderr, flush=True)
        sys.stdout.flush()
        group.abort(130 if isinstance(exc, KeyboardInterrupt) else 1)
