"""A simulated network: a `Group` whose every operation takes the α–β time of a chosen link.

On a laptop every rank talks through shared memory, so communication looks free.
`LinkGroup(inner, link)` wraps any group and makes each operation complete no earlier
than its start plus the time the link would need:

    modelled  = the planner's α–β formula for the operation (parallel.plan.cost):
                all-reduce 2(n−1)(α + N/n·β), all-gather and reduce-scatter (n−1)(α + N/n·β),
                send/recv α + N·β (N: the bytes of the whole buffer, α: seconds per message,
                β: seconds per byte), all-to-all (n−1)α + S·β (S: the bytes this rank sends
                to the others, as Group.stats() counts them); broadcast is charged as the scatter + all-gather
                broadcast (van de Geijn), i.e. an all-reduce's time; barrier and split as an
                all-reduce of nothing, 2(n−1)α
    completes = max(actual completion, start + modelled)

so the link waits only the difference (modelled − actual). A non-blocking operation's
clock starts when it is started, not when it is waited for: compute done meanwhile
hides its time, exactly as on a real network, so overlap is real and measurable.
Results are never touched: the inner group does the communication, the link only
delays its completion. The counted bytes are the inner formula's (β·counted bytes is
the β part of the modelled time, to rounding), so time and bytes cannot disagree.

Per kind of operation the group records (`link_stats()`):
    modelled_s  the sum of the modelled times
    measured_s  the sum of the actual times: start until this rank saw the inner operation
                complete (a non-blocking one is only looked at when waited for)
    exposed_s   the time this rank spent blocked waiting for it (from the first wait until
                completion): communication that compute did not hide
"""
import math
import time

from ..alpha_beta import all_gather, all_to_all, ring_all_reduce, send_recv
from .group import Group
from .request import Pending

# Links as data: per-message latency α (µs) and bandwidth (GB/s = 1e9 bytes/s), the
# planner's profile units. Nominal figures for one link of each kind.
LINKS = {
    "loopback": {"alpha_us": 0.0, "bandwidth_gbps": math.inf, "what": "no delay (whatever the machine does)"},
    "100mbe": {"alpha_us": 100.0, "bandwidth_gbps": 0.0125, "what": "100 Mb/s Ethernet (or a slow Wi-Fi), TCP"},
    "1gbe": {"alpha_us": 50.0, "bandwidth_gbps": 0.125, "what": "1 Gb/s Ethernet, TCP"},
    "10gbe": {"alpha_us": 20.0, "bandwidth_gbps": 1.25, "what": "10 Gb/s Ethernet, TCP"},
    "ib-hdr": {"alpha_us": 2.0, "bandwidth_gbps": 25.0, "what": "InfiniBand HDR, 200 Gb/s"},
    "nvlink": {"alpha_us": 5.0, "bandwidth_gbps": 250.0, "what": "NVLink 3 (A100), per GPU"},
    # measured, not nominal: python -m parallel.bench network's send/recv fit on two network
    # namespaces joined by a veth shaped to 100 Mbit/s (tc tbf), MPICH ofi/tcp, 2026-12-04: β = 82.8 ns/B
    # (the token bucket's 80 plus TCP/IP framing), α below what the fit resolves; the dp step it
    # predicted was 0.99 of the real one
    "veth-100mbit": {"alpha_us": 0.0, "bandwidth_gbps": 1 / 82.8, "what": "a veth shaped to 100 Mbit/s, MPICH "
                     "over TCP, measured (parallel.bench network)"},
}


class Link:
    """α seconds per message and β seconds per byte, with a name for messages."""

    def __init__(self, name, alpha, beta):
        if not (alpha >= 0 and beta >= 0 and math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(f"link {name!r}: alpha={alpha!r} s and beta={beta!r} s/byte must be finite and ≥ 0 "
                             f"(α is the seconds a message costs before its first byte, β the seconds per byte: "
                             f"a link cannot take negative time)")
        self.name, self.alpha, self.beta = name, float(alpha), float(beta)

    def __repr__(self):
        return f"Link({self.name!r}, alpha={self.alpha:g} s, beta={self.beta:g} s/B)"

    @property
    def free(self):
        return self.alpha == 0 and self.beta == 0

    def seconds(self, kind, n, nbytes):
        """Modelled time of one operation of `kind` on `n` ranks with a buffer of `nbytes`
        (all_gather: the gathered bytes; reduce_scatter: the unscattered bytes; all_to_all:
        the bytes this rank sends to the others)."""
        if n == 1 and kind not in ("send", "recv"):
            return 0.0
        if kind in ("all_gather", "reduce_scatter"):
            return all_gather(n, nbytes, self.alpha, self.beta)
        if kind in ("send", "recv"):
            return send_recv(nbytes, self.alpha, self.beta)
        if kind == "all_to_all":
            return all_to_all(n, nbytes, self.alpha, self.beta)
        if kind in ("all_reduce", "broadcast"):
            return ring_all_reduce(n, nbytes, self.alpha, self.beta)
        return ring_all_reduce(n, 0, self.alpha, self.beta)  # barrier, split


def parse_link(text):
    """A `Link` from a name in LINKS or from 'ALPHA,BETA' (seconds per message, seconds per byte)."""
    if text in LINKS:
        figures = LINKS[text]
        return Link(text, figures["alpha_us"] * 1e-6, 1 / (figures["bandwidth_gbps"] * 1e9))
    parts = text.split(",")
    try:
        alpha, beta = (float(part) for part in parts)
    except ValueError:
        raise ValueError(f"--link {text!r} is neither a link name ({', '.join(LINKS)}) nor 'ALPHA,BETA' "
                         f"(seconds per message, seconds per byte; e.g. 50e-6,8e-9)") from None
    return Link(text, alpha, beta)


class LinkGroup(Group):
    """`inner` with every operation taking at least `link`'s modelled time (module docstring).
    Groups split from it are LinkGroups on the same link."""

    def __init__(self, inner, link):
        super().__init__(inner.rank, inner.size)
        self.inner, self.link = inner, link
        self.backend = inner.backend
        self.poll_backoff = inner.poll_backoff
        self.timeout, self.debug = inner.timeout, inner.debug
        self._link_stats = {}

    def __repr__(self):
        return f"<LinkGroup {self.link.name} over {self.inner!r}>"

    def world_ranks(self):
        return self.inner.world_ranks()

    def abort(self, code=1):
        self.inner.abort(code)

    def configure(self, timeout=None, debug=None):
        self.inner.configure(timeout, debug)
        return super().configure(timeout, debug)

    # --- accounting of time -------------------------------------------------------------

    def link_stats(self):
        """kind -> {"modelled_s", "measured_s", "exposed_s"} for this rank (a copy)."""
        return {kind: dict(seconds) for kind, seconds in self._link_stats.items()}

    def stats(self):
        """Group.stats() with each kind's link seconds beside its calls, elements and bytes."""
        counts = super().stats()
        for kind, seconds in self._link_stats.items():
            counts.setdefault(kind, {"calls": 0, "elements": 0, "bytes": 0}).update(seconds)
        return counts

    def reset_stats(self):
        super().reset_stats()
        self._link_stats = {}

    def _record(self, kind, modelled, measured, exposed):
        seconds = self._link_stats.setdefault(kind, {"modelled_s": 0.0, "measured_s": 0.0, "exposed_s": 0.0})
        seconds["modelled_s"] += modelled
        seconds["measured_s"] += measured
        seconds["exposed_s"] += exposed

    # --- the delay: complete at max(actual, start + modelled) -------------------------------

    def _delayed(self, kind, nbytes, pending):
        """`pending` (the inner operation, just started) made to complete no earlier than
        start + the link's time for `kind` over `nbytes`."""
        started = time.monotonic()
        modelled = self.link.seconds(kind, self.size, nbytes)
        state = {"actual": None, "first_wait": None}

        def poll(pause):
            if state["first_wait"] is None:
                state["first_wait"] = time.monotonic()
            if state["actual"] is None:
                if not pending.poll(pause):
                    return False
                state["actual"] = time.monotonic() - started
            # The data has arrived; the link holds it until start + modelled (no progress to make).
            remaining = started + modelled - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
            self._record(kind, modelled, state["actual"], time.monotonic() - state["first_wait"])
            return True
        return Pending(poll, pending.finish, pending.missing)

    def _iall_reduce(self, buf, op):
        return self._delayed("all_reduce", buf.nbytes, self.inner._iall_reduce(buf, op))

    def _iall_gather(self, buf, out):
        return self._delayed("all_gather", out.nbytes, self.inner._iall_gather(buf, out))

    def _ireduce_scatter(self, blocks, out, op):
        return self._delayed("reduce_scatter", blocks.nbytes, self.inner._ireduce_scatter(blocks, out, op))

    def _ibroadcast(self, buf, root):
        return self._delayed("broadcast", buf.nbytes, self.inner._ibroadcast(buf, root))

    def _ibarrier(self):
        return self._delayed("barrier", 0, self.inner._ibarrier())

    def _isplit(self, color, key):
        pending = self.inner._isplit(color, key)
        wrapped = Pending(pending.poll, lambda: LinkGroup(pending.finish(), self.link), pending.missing)
        return self._delayed("split", 0, wrapped)

    def _iall_to_all(self, buf, send, out, recv):
        sent = (buf.shape[0] - send[self.rank]) * (buf.nbytes // max(buf.shape[0], 1))  # rows to the others
        return self._delayed("all_to_all", sent, self.inner._iall_to_all(buf, send, out, recv))

    def _isend(self, buf, dst, tag):
        return self._delayed("send", buf.nbytes, self.inner._isend(buf, dst, tag))

    def _irecv(self, buf, src, tag):
        return self._delayed("recv", buf.nbytes, self.inner._irecv(buf, src, tag))


def with_link(group, link):
    """`group` on `link` (a Link, a name or 'ALPHA,BETA'); None leaves it as it is. (Even
    'loopback' wraps it: no delay, but the measured and exposed times are recorded.)"""
    if link is None:
        return group
    return LinkGroup(group, parse_link(link) if isinstance(link, str) else link)
