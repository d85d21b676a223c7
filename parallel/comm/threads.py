"""The threads backend: N ranks as N threads of one process.

All groups of one `run_threads` world share one condition variable (`_World`);
every state change happens under it and wakes the waiters. That makes three
guarantees cheap to keep:

* an exception on any rank is recorded and every waiting rank raises
  `CommAborted` at once, so `run_threads` re-raises the original exception;
* a deadlock is detected instead of hanging: when every live rank is waiting
  and none has seen a change since, `DeadlockError` names what each waits for;
* collectives check that every rank called the same one with matching
  shapes, dtypes and arguments (MPI cannot check this cheaply).

Matching follows MPI: the k-th collective call of each rank on a group meet;
messages from one source with one tag are received in the order sent.
`send` is synchronous (it returns once the receive is posted, like
MPI_Ssend), so a program that relies on MPI buffering fails here quickly
rather than hanging under mpiexec with large messages.
"""
import threading
import time
from collections import defaultdict

import numpy as np

from .group import Group, Request, REDUCE_UFUNCS, check_message

POLL_SECONDS = 0.1  # waits wake at least this often (Ctrl-C, timeouts)
_local = threading.local()


class CommAborted(RuntimeError):
    """Raised on a waiting rank because another rank failed."""


class DeadlockError(RuntimeError):
    """Every live rank is waiting for another."""


class _World:
    """State shared by the threads of one run_threads call."""

    def __init__(self, size):
        self.cond = threading.Condition()
        self.live = size
        self.waiting = {}  # rank -> what it waits for, for ranks that saw the latest change
        self.error = None
        self.failed_rank = None

    def changed(self):
        """Call with cond held after any state change: every waiter must look again."""
        self.waiting.clear()
        self.cond.notify_all()

    def fail(self, exc, rank):
        if self.error is None:
            self.error, self.failed_rank = exc, rank
        self.changed()

    def wait_until(self, ready, what):
        """Wait (cond held) until ready() is true; raise if a rank failed or all are stuck."""
        me = getattr(_local, "rank", 0)
        while not ready():
            if self.error is not None:
                raise CommAborted(f"rank {me} stopped waiting in {what}: rank {self.failed_rank} failed")
            self.waiting[me] = what
            if len(self.waiting) >= self.live:
                stuck = "; ".join(f"rank {r} in {w}" for r, w in sorted(self.waiting.items()))
                self.fail(DeadlockError(f"deadlock, every live rank is waiting: {stuck}"), me)
                raise self.error
            self.cond.wait(POLL_SECONDS)
            self.waiting.pop(me, None)


class _Slot:
    """One collective call in progress: each rank's entry, then the shared result."""

    def __init__(self):
        self.entries = {}  # rank -> (kind, signature, contribution)
        self.result = None
        self.done = False
        self.readers = 0


class _Message:
    def __init__(self, tag, data):
        self.tag, self.data, self.matched = tag, data, False


class _Receive:
    def __init__(self, tag):
        self.tag, self.message = tag, None


class _GroupState:
    """What the members of one group share: collective slots and the message queues."""

    def __init__(self, world, size):
        self.world, self.size = world, size
        self.calls = [0] * size  # collectives started by each rank
        self.slots = {}  # call number -> _Slot
        self.unexpected = defaultdict(list)  # (src, dst) -> sent, not yet matched messages
        self.posted = defaultdict(list)  # (src, dst) -> posted, not yet matched receives


def _pop_first(queue, tag):
    for i, item in enumerate(queue):
        if item.tag == tag:
            return queue.pop(i)
    return None


def _check_same_call(entries, size):
    kinds = {r: kind for r, (kind, _, _) in entries.items()}
    if len(set(kinds.values())) > 1:
        calls = ", ".join(f"rank {r} called {k}" for r, k in sorted(kinds.items()))
        raise ValueError(f"collective mismatch in a group of size {size}: {calls}")
    signatures = {r: sig for r, (_, sig, _) in entries.items()}
    if len(set(signatures.values())) > 1:
        kind = kinds[0]
        described = "; ".join(f"rank {r}: {dict(sig)}" for r, sig in sorted(signatures.items()))
        raise ValueError(f"{kind} called with different arguments across ranks: {described}")


class ThreadGroup(Group):
    backend = "threads"

    def __init__(self, state, rank):
        super().__init__(rank, state.size)
        self._state = state

    # --- collectives: deposit an entry, the last rank combines, each rank takes its part

    def _collective(self, kind, signature, contribution, combine, take):
        """Start this rank's part of the group's next collective; the Request's wait() returns take(result)."""
        state, world = self._state, self._state.world
        with world.cond:
            number = state.calls[self.rank]
            state.calls[self.rank] += 1
            slot = state.slots.setdefault(number, _Slot())
            slot.entries[self.rank] = (kind, tuple(sorted(signature.items())), contribution)
            if len(slot.entries) == state.size:
                _check_same_call(slot.entries, state.size)
                slot.result = combine([slot.entries[r][2] for r in range(state.size)])
                slot.done = True
                world.changed()

        def complete():
            with world.cond:
                world.wait_until(lambda: slot.done, f"{kind} (group of size {state.size})")
                slot.readers += 1
                if slot.readers == state.size:
                    del state.slots[number]
            return take(slot.result)
        return Request(complete)

    def _iall_reduce(self, buf, op):
        reduce = REDUCE_UFUNCS[op]

        def combine(bufs):
            total = bufs[0].copy()
            for other in bufs[1:]:  # rank order: every rank gets the same bits
                reduce(total, other, out=total)
            return total
        signature = {"shape": buf.shape, "dtype": str(buf.dtype), "op": op}
        return self._collective("all_reduce", signature, buf, combine, lambda total: np.copyto(buf, total))

    def _all_reduce(self, buf, op):
        self._iall_reduce(buf, op).wait()

    def _all_gather(self, buf, out):
        signature = {"shape": buf.shape, "dtype": str(buf.dtype)}
        self._collective("all_gather", signature, buf, np.stack, lambda stacked: np.copyto(out, stacked)).wait()

    def _reduce_scatter(self, blocks, out, op):
        signature = {"shape": blocks.shape, "dtype": str(blocks.dtype), "op": op}
        combine = REDUCE_UFUNCS[op].reduce  # over axis 0 of the stacked inputs, in rank order
        take = lambda reduced: np.copyto(out, reduced[self.rank])
        self._collective("reduce_scatter", signature, blocks, lambda bufs: combine(np.stack(bufs)), take).wait()

    def _broadcast(self, buf, root):
        signature = {"shape": buf.shape, "dtype": str(buf.dtype), "root": root}
        combine = lambda bufs: bufs[root].copy()
        self._collective("broadcast", signature, buf, combine, lambda data: np.copyto(buf, data)).wait()

    def _barrier(self):
        self._collective("barrier", {}, None, lambda _: None, lambda _: None).wait()

    def _split(self, color, key):
        world = self._state.world

        def combine(colors_keys):
            placement = {}
            for color in set(c for c, _ in colors_keys):
                members = sorted((k, r) for r, (c, k) in enumerate(colors_keys) if c == color)
                state = _GroupState(world, len(members))
                for new_rank, (_, r) in enumerate(members):
                    placement[r] = (state, new_rank)
            return placement
        take = lambda placement: ThreadGroup(*placement[self.rank])
        return self._collective("split", {}, (color, key), combine, take).wait()

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

        def complete():
            with world.cond:
                world.wait_until(lambda: message.matched, f"send(dst={dst}, tag={tag})")
        return Request(complete)

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

        def complete():
            with world.cond:
                world.wait_until(lambda: receive.message is not None, f"recv(src={src}, tag={tag})")
            data = receive.message.data
            check_message(buf, data.shape, data.dtype, src, tag)
            np.copyto(buf, data)
        return Request(complete)


def current_group():
    """The calling thread's world inside run_threads, else None."""
    return getattr(_local, "group", None)


def single_rank_group():
    """A fresh size-1 world, for code run outside any launcher."""
    return ThreadGroup(_GroupState(_World(1), 1), 0)


def run_threads(world_size, fn, *args, timeout=None):
    """Run fn(*args) on `world_size` threads, each seeing its own rank via parallel.world().

    Returns the per-rank results. If any rank raises, every other rank is
    released and the original exception is re-raised here, with a note naming
    the rank. `timeout` (seconds) bounds the whole run: TimeoutError.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run_threads: world_size={world_size!r} must be a positive int")
    world = _World(world_size)
    state = _GroupState(world, world_size)
    results = [None] * world_size

    def body(rank):
        _local.rank, _local.group = rank, ThreadGroup(state, rank)
        try:
            results[rank] = fn(*args)
        except CommAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            with world.cond:
                world.fail(exc, rank)
        finally:
            with world.cond:
                world.live -= 1
                world.changed()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank {r}", daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    running = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if running:
        with world.cond:
            world.fail(TimeoutError(f"run_threads: ranks {running} still running after {timeout} s"), None)
    if world.error is not None:
        error = world.error
        if world.failed_rank is not None:
            error.add_note(f"raised on rank {world.failed_rank} of run_threads(world_size={world_size})")
        raise error
    return results
