"""`Request`: a started communication, and the deadline every wait is held to.

A backend never blocks. It starts an operation and returns a `Pending`, which
can only be polled: `poll(pause)` says whether the operation has completed and,
if not, may block up to `pause` seconds waiting for progress. `Request.wait()`
polls until the operation completes or the group's `timeout` (seconds since the
operation started) runs out, and then raises `CommTimeout`, naming the
operation, the group, this rank, the time waited and what this rank knows about
who is missing. Every collective, every message and the ring wait here, on
both backends, so the deadline is written once.

How long each poll may block comes from the group's `poll_backoff = (spin,
first, most)`: for the first `spin` seconds polls do not block, then they may
block `first` seconds, doubling up to `most`. Under MPI a non-blocking
collective advances only while some MPI call runs on the rank, so the spin
keeps short operations as fast as MPI's blocking calls (which spin for ever);
a long wait (a pipeline bubble, a slow or stopped rank) then sleeps instead of
burning a core the other ranks need.
"""
import time


class CommTimeout(TimeoutError):
    """A communication did not complete within its group's timeout (a rank stopped, stuck or elsewhere)."""


class Pending:
    """What a backend's non-blocking primitive returns.

    poll(pause) -> bool: has it completed? (may block up to `pause` s if not; raises on a failed operation)
    finish() -> the operation's result, called once after poll said True
    missing() -> str or None: who this rank knows has not taken part yet, for the timeout message
    """

    def __init__(self, poll, finish=None, missing=None):
        self.poll = poll
        self.finish = finish or (lambda: None)
        self.missing = missing or (lambda: None)


class Request:
    """A pending operation of `group`; `wait()` completes it (once) and returns then(result)."""

    def __init__(self, group, what, pending, then=None):
        self._group, self._what, self._pending = group, what, pending
        self._then = then or (lambda result: result)
        self._started = time.monotonic()
        self._done = False
        self._result = None

    def wait(self):
        if not self._done:
            self._poll_until_complete()
            self._result = self._then(self._pending.finish())
            self._done = True
        return self._result

    def _poll_until_complete(self):
        """Poll without blocking for the first `spin` seconds, then blocking `first` seconds, doubling
        up to `most` (the group's poll_backoff); past the deadline, raise CommTimeout."""
        spin, pause, most = self._group.poll_backoff
        spin_until, deadline = self._started + spin, self._started + self._group.timeout
        now = self._started
        while not self._pending.poll(0.0 if now < spin_until else min(pause, deadline - now)):
            now = time.monotonic()
            if now >= deadline:
                raise CommTimeout(self._timeout_message())
            if now >= spin_until:
                pause = min(2 * pause, most)

    def _timeout_message(self):
        group = self._group
        missing = self._pending.missing() or "this rank cannot tell which ranks are missing"
        return (f"{self._what} timed out on rank {group.rank} of {group.describe()} after "
                f"{time.monotonic() - self._started:.1f} s (timeout={group.timeout:g} s): {missing}")
