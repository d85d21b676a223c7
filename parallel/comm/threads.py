"""The threads backend: N ranks as N threads of one process. All groups of one `run_threads`
world share one condition variable (`_World`); every state change happens under it and wakes
the waiters. That makes these guarantees cheap to keep:

* an exception on any rank is recorded and every waiting rank raises `CommAborted` at
  once, so `run_threads` re-raises the original exception;
* a deadlock is detected instead of hanging: when every live rank is waiting and none has seen a
  change since, `DeadlockError` names what each waits for; a rank stuck elsewhere (in compute) is
  caught by the deadline (request.py), whose `CommTimeout` names the ranks that have not arrived;
* collectives check that every rank called the same one with matching shapes, dtypes and
  arguments (MPI only under PARALLEL_DEBUG=1, debug.py).

Matching follows MPI: the k-th collective call of each rank on a group meet; messages from one source
with one tag are received in the order sent. `send` is synchronous (it returns once the receive is
posted, like MPI_Ssend): a program relying on MPI buffering fails here fast, not hanging under mpiexec.
Ranks share the cores: while they run, BLAS runs one thread (as each mpiexec rank does: launch.py)."""
import math
import threading
import time
from collections import defaultdict

import numpy as np

from minitensor.kernel_threads import blas_thread_per_rank

from .checks import REDUCE_UFUNCS, check_message, check_same_call, received_blocks
from .group import Group
from .request import Pending

POLL_SECONDS = 0.1  # waits wake at least this often (Ctrl-C, deadlines); a change wakes them at once
_local = threading.local()


class CommAborted(RuntimeError):
    """Raised on a waiting rank because another rank failed."""


class DeadlockError(RuntimeError):
    """Every live rank is waiting for another."""


class _World:
    """State shared by the threads of one run_threads call."""

    def __init__(self, size):
        self.cond, self.live, self.waiting = threading.Condition(), size, {}  # waiting: rank -> what it waits for
        self.error = self.failed_rank = None
        self.last_poll = -math.inf  # when a rank last looked: ranks in a wait look every POLL_SECONDS

    def changed(self):
        """Call with cond held after any state change: every waiter must look again."""
        self.waiting.clear()
        self.cond.notify_all()

    def fail(self, exc, rank):
        if self.error is None:
            self.error, self.failed_rank = exc, rank
        self.changed()

    def pending(self, ready, what, finish=None, missing=None):
        """A request.Pending that is complete when ready() (read under cond) is true."""
        def poll(pause):
            with self.cond:
                return self.look(ready, what, pause)
        return Pending(poll, finish, missing)

    def look(self, ready, what, pause):
        """(cond held) Is ready() true? If not, raise if a rank failed or every live rank
        is stuck, else wait up to `pause` seconds for a change and look again."""
        self.last_poll = time.monotonic()
        if ready():
            return True
        me = getattr(_local, "rank", 0)
        if self.error is not None:
            raise CommAborted(f"rank {me} stopped waiting in {what}: rank {self.failed_rank} failed")
        self.waiting[me] = what
        if len(self.waiting) >= self.live:
            stuck = "; ".join(f"rank {r} in {w}" for r, w in sorted(self.waiting.items()))
            self.fail(DeadlockError(f"deadlock, every live rank is waiting: {stuck}"), me)
            raise self.error
        self.cond.wait(pause)
        self.waiting.pop(me, None)
        return ready()


class _Slot:
    """One collective call in progress: each rank's entry, then the shared result."""

    def __init__(self):
        self.entries = {}  # rank -> (kind, signature, contribution)
        self.result, self.done, self.readers = None, False, 0


class _Message:
    def __init__(self, tag, data):
        self.tag, self.data, self.matched = tag, data, False


class _Receive:
    def __init__(self, tag):
        self.tag, self.message = tag, None


class _GroupState:
    """What the members of one group share: collective slots and the message queues."""

    def __init__(self, world, world_ranks):
        self.world, self.world_ranks, self.size = world, world_ranks, len(world_ranks)
        self.calls = [0] * self.size  # collectives started by each rank
        self.slots = {}  # call number -> _Slot
        self.unexpected = defaultdict(list)  # (src, dst) -> sent, not yet matched messages
        self.posted = defaultdict(list)  # (src, dst) -> posted, not yet matched receives


def _pop_first(queue, tag):
    for i, item in enumerate(queue):
        if item.tag == tag:
            return queue.pop(i)
    return None


class ThreadGroup(Group):
    backend = "threads"
    poll_backoff = (0, POLL_SECONDS, POLL_SECONDS)  # a wait sleeps on the condition; a change wakes it

    def __init__(self, state, rank):
        super().__init__(rank, state.size)
        self._state = state

    def world_ranks(self):
        return self._state.world_ranks

    # --- collectives: deposit an entry, the last rank combines, each rank takes its part

    def _collective(self, kind, signature, contribution, combine, take):
        """Start this rank's part of the group's next collective; its finish() returns take(result)."""
        state, world = self._state, self._state.world
        with world.cond:
            number = state.calls[self.rank]
            state.calls[self.rank] += 1
            slot = state.slots.setdefault(number, _Slot())
            slot.entries[self.rank] = (kind, signature, contribution)
            if len(slot.entries) == state.size:
                check_same_call({r: entry[:2] for r, entry in slot.entries.items()}, state.size)
                slot.result = combine([slot.entries[r][2] for r in range(state.size)])
                slot.done = True
                world.changed()

        def finish():
            with world.cond:
                slot.readers += 1
                if slot.readers == state.size:
                    del state.slots[number]
            return take(slot.result)

        def missing():
            absent = [r for r in range(state.size) if r not in slot.entries]
            world_ranks = [state.world_ranks[r] for r in absent]
            return f"rank(s) {absent} of this group (world ranks {world_ranks}) have not called {kind}"
        return world.pending(lambda: slot.done, f"{kind} (group of size {state.size})", finish, missing)

    def _iall_reduce(self, buf, op):
        reduce = REDUCE_UFUNCS[op]

        def combine(bufs):
            total = bufs[0].copy()
            for other in bufs[1:]:  # rank order: every rank gets the same bits
                reduce(total, other, out=total)
            return total
        signature = {"shape": buf.shape, "dtype": str(buf.dtype), "op": op}
        return self._collective("all_reduce", signature, buf, combine, lambda total: np.copyto(buf, total))

    def _iall_gather(self, buf, out):
        signature = {"shape": buf.shape, "dtype": str(buf.dtype)}
        return self._collective("all_gather", signature, buf, np.stack, lambda stacked: np.copyto(out, stacked))

    def _ireduce_scatter(self, blocks, out, op):
        signature = {"shape": blocks.shape, "dtype": str(blocks.dtype), "op": op}
        combine = REDUCE_UFUNCS[op].reduce  # over axis 0 of the stacked inputs, in rank order
        take = lambda reduced: np.copyto(out, reduced[self.rank])
        return self._collective("reduce_scatter", signature, blocks, lambda bufs: combine(np.stack(bufs)), take)

    def _ibroadcast(self, buf, root):
        signature = {"shape": buf.shape, "dtype": str(buf.dtype), "root": root}
        combine = lambda bufs: bufs[root].copy()
        return self._collective("broadcast", signature, buf, combine, lambda data: np.copyto(buf, data))

    def _iall_to_all(self, buf, send, out, recv):
        signature = {"shape": buf.shape[1:], "dtype": str(buf.dtype)}  # the rows' shape: their counts differ
        take = lambda sent: np.concatenate(received_blocks(sent, self.rank, recv), out=out)
        return self._collective("all_to_all", signature, (buf, send), list, take)

    def _ibarrier(self):
        return self._collective("barrier", {}, None, lambda _: None, lambda _: None)

    def _isplit(self, color, key):
        state = self._state

        def combine(colors_keys):
            placement = {}
            for shared in {c for c, _ in colors_keys}:
                members = sorted((k, r) for r, (c, k) in enumerate(colors_keys) if c == shared)
                child = _GroupState(state.world, [state.world_ranks[r] for _, r in members])
                for new_rank, (_, r) in enumerate(members):
                    placement[r] = (child, new_rank)
            return placement
        take = lambda placement: ThreadGroup(*placement[self.rank])
        return self._collective("split", {}, (color, key), combine, take)

    # --- point to point: MPI's matching engine in miniature

    def _isend(self, buf, dst, tag):
        state, world = self._state, self._state.world
        message = _Message(tag, buf.copy())
        with world.cond:
            receive = _pop_first(state.posted[(self.rank, dst)], tag)
            if receive is None:
                state.unexpected[(self.rank, dst)].append(message)
            else:
                receive.message, message.matched = message, True
            world.changed()
        return world.pending(lambda: message.matched, f"send(dst={dst}, tag={tag})", None,
                             lambda: f"rank {dst} has not posted the matching receive (tag {tag})")

    def _irecv(self, buf, src, tag):
        state, world = self._state, self._state.world
        receive = _Receive(tag)
        with world.cond:
            message = _pop_first(state.unexpected[(src, self.rank)], tag)
            if message is None:
                state.posted[(src, self.rank)].append(receive)
            else:
                receive.message, message.matched = message, True
                world.changed()

        def finish():
            data = receive.message.data
            check_message(buf, data.shape, data.dtype, src, tag)
            np.copyto(buf, data)
        return world.pending(lambda: receive.message is not None, f"recv(src={src}, tag={tag})", finish,
                             lambda: f"rank {src} has not sent the message (tag {tag})")


def current_group():
    """The calling thread's world inside run_threads, else None."""
    return getattr(_local, "group", None)


def single_rank_group():
    """A fresh size-1 world, for code run outside any launcher."""
    return ThreadGroup(_GroupState(_World(1), [0]), 0)


def run_threads(world_size, fn, *args, timeout=None):
    """Run fn(*args) on `world_size` threads, each seeing its own rank via parallel.world().

    Returns the per-rank results. If any rank raises, every other rank is released and the
    original exception is re-raised here, with a note naming the rank (a rank stuck outside
    communication cannot be stopped; its daemon thread is left behind). `timeout` (seconds)
    bounds the whole run: TimeoutError."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run_threads: world_size={world_size!r} must be a positive int")
    world = _World(world_size)
    state = _GroupState(world, list(range(world_size)))
    results, finished = [None] * world_size, [False] * world_size

    def body(rank):
        _local.rank = rank
        try:
            _local.group = ThreadGroup(state, rank)
            results[rank] = fn(*args)
        except CommAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            with world.cond:
                world.fail(exc, rank)
        finally:
            with world.cond:
                finished[rank] = True
                world.live -= 1
                world.changed()

    deadline = math.inf if timeout is None else time.monotonic() + timeout
    with blas_thread_per_rank(world_size), world.cond:  # until every rank has returned, one failed, or time is out
        for r in range(world_size):
            threading.Thread(target=body, args=(r,), name=f"rank {r}", daemon=True).start()
        while world.live and world.error is None and time.monotonic() < deadline:
            world.cond.wait(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        running = [r for r in range(world_size) if not finished[r]]
        if running and world.error is None:
            world.fail(TimeoutError(f"run_threads: ranks {running} still running after {timeout} s"), None)
        # Waiting ranks see the failure and leave at once; one busy elsewhere cannot be stopped.
        while world.live and time.monotonic() - world.last_poll < 2 * POLL_SECONDS:
            world.cond.wait(POLL_SECONDS)
    if world.error is not None:
        error = world.error
        if world.failed_rank is not None:
            error.add_note(f"raised on rank {world.failed_rank} of run_threads(world_size={world_size})")
        raise error
    return results
