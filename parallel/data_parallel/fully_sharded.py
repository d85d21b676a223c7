"""ZeRO stages 2 and 3 (Rajbhandari et al., 2020; PyTorch FSDP): shard the gradients, then the parameters.

    stage   what each of the n dp ranks keeps between steps            (ZeRO-1: zero.py)
      1     full parameters, full gradients, 1/n of the AdamW moments
      2     full parameters, 1/n of the averaged gradients, 1/n of the moments
      3     1/n of the parameters, 1/n of the gradients, 1/n of the moments

Stage 2. The gradient reducer's buckets are reduce-scattered instead of all-reduced
(`reducer.ShardedReducer`), each as soon as backward has made it ready (DataParallel's
hooks start them in index order), and every full `.grad` of the bucket is freed: the
rank keeps only its chunk of the averaged gradient. The optimizer updates its chunk of
the parameters and all-gathers them (ZeroOptimizer, stage 2).

Stage 3. The parameters are grouped into units (a transformer block, the embedding,
the head: `FlatUnit`), each laid end to end and cut into n chunks; a rank keeps only its
chunk (`param_shard`), and a parameter's `.data` is a placeholder of its shape (NaN: a
read outside its unit shows). Around every use of a unit (`fully_shard` wraps its forward):

    forward:   all-gather the unit (prefetched: issued while the previous unit computed)
               run it: the graph saves a *reference* to each parameter's place, not its
               values (minitensor.autograd.saved_tensors_hooks), then free the gathered copy
    backward:  the first read of a saved reference all-gathers the unit again (and issues
               the next ones ahead), and the copy is freed when the last node that saved
               it has been released
    gradients: the unit's gradients are reduce-scattered as soon as they are final
               (the same ShardedReducer, one bucket per unit)

The order of the all-gathers is data, not an accident of autograd: each forward pass of
a `Sharding` records its uses of units; its backward gathers are exactly those uses in
reverse (`Pass.gathers`), issued strictly in that order (`gathers_due`), each once. A use a
rank's loss does not reach (never read in backward) is still gathered, in its place,
when a later one is needed (or right after the last one that is), so every rank issues
the same collectives in the same order; a unit used twice (tied, or called twice) is
gathered once per use. `schedule()` prints the list; `check_gathers` proves that ranks
whose backward reaches different uses still issue the same sequence.

Where the pieces live: the units' flat chunks in flat_units.py, a pass's uses and the
order of their backward gathers in gather_order.py. Who uses it: `FullyShardedDataParallel`
(fsdp.py) for any module, and HybridGPT's pipeline stages (parallel/hybrid/zero_units.py).

The all-gathers run on their own communicator (a copy of the dp group) so that they
never interleave with the gradient reduce-scatters, whose timing depends on hooks.
"""
import contextlib
import functools
import time

from minitensor.autograd import is_grad_enabled, saved_tensors_hooks, topological_order

from .flat_units import FlatUnit, owner
from .gather_order import Pass, SavedParameter, Use, gathers_due
from .reducer import keep_chunk


class Sharding:
    """The units of one module tree and the order their all-gathers run in (module docstring).

    `names`: the units' names, `buckets`: the ShardedReducer buckets holding their parameters
    (in the same order; each is gathered over a copy of its `group`: the dp group, or another
    group of replicas such as a mixture of experts' edp), `prefetch`: how many gathers are
    issued ahead in forward and in backward; `first_order`: the unit names in the order the
    first forward is expected to use them (default `names`)."""

    def __init__(self, names, buckets, prefetch=1, first_order=None):
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch={prefetch!r} must be a non-negative int")
        copies = {}  # the gathers' own communicator per group of replicas, in the order the buckets name them
        for bucket in buckets:
            copies.setdefault(id(bucket.group), bucket.group.split(0))
        self.groups = list(copies.values())
        self.units = [FlatUnit(name, bucket, copies[id(bucket.group)]) for name, bucket in zip(names, buckets)]
        self.prefetch = prefetch
        by_name = {unit.name: unit for unit in self.units}
        # the last pass's order of uses, which the forward prefetch follows, and of its backward gathers
        self.forward_order = [by_name[name] for name in first_order or names]
        self.backward_order = self.forward_order[::-1]
        self.passes, self.current, self.running = [], None, []
        self.prefetched = {}  # unit -> its forward gather issued ahead
        self.events, self.t0 = [], time.perf_counter()  # the last step's (kind, unit, start, end)
        self.step_done = False  # finish() ran: the next event starts a new step's record
        self.peak_gathered_bytes = 0
        self.last_pass = None  # the last forward pass with backward gathers to come

    # --- forward -------------------------------------------------------------------

    @contextlib.contextmanager
    def forward_pass(self):
        """Record one forward pass (nested calls join the outer one)."""
        if self.current is not None:
            yield
            return
        self.current = Pass()
        try:
            with saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            finished, self.current = self.current, None
            for unit in list(self.prefetched):  # issued ahead but not used: complete and drop
                self.prefetched.pop(unit).wait()
            if finished.started:
                self.forward_order = finished.started
            finished.close()
            if finished.gathers:
                self.backward_order = [use.unit for use in finished.gathers]
            self.last_pass = finished if is_grad_enabled() and finished.gathers else None
            if self.last_pass:
                self.passes.append(finished)

    def run_unit(self, unit, forward, *args, **kwargs):
        """A unit's forward: gather (or take the prefetched gather), prefetch the next, run, free."""
        with self.forward_pass():
            use = Use(unit, self.current)
            self.current.started.append(unit)
            request = self.prefetched.pop(unit, None) or self.issue(unit, "forward")
            self.prefetch_after(len(self.current.started) - 1)
            use.full = self.wait(request, unit, "forward")
            unit.attach(use.full)
            self.running.append(use)
            self.note_gathered()
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.log("F", unit, start)
                self.running.pop()
                self.current.uses.append(use)
                unit.free()
                use.full = None

    def prefetch_after(self, index):
        for unit in self.forward_order[index + 1:index + 1 + self.prefetch]:
            if unit not in self.prefetched:
                self.prefetched[unit] = self.issue(unit, "forward")

    # --- the saved references and backward -----------------------------------------

    def pack(self, array):
        """A saved array that views a running unit's gathered copy becomes a reference."""
        memory = owner(array)
        for use in self.running:
            if use.full is not None and memory is owner(use.full):
                return SavedParameter(use, array, use.full)
        return array

    def unpack(self, saved):
        if not isinstance(saved, SavedParameter):
            return saved
        use = saved.use
        if use.full is None:
            self.gather_for_backward(use)
        return saved.view()

    def gather_for_backward(self, use):
        """Issue this pass's backward gathers in order through `use` (and `prefetch` more, and
        every following one that this rank's backward will not reach), then wait for `use`."""
        if use not in use.a_pass.gathers or use.issued and use.request is None:
            raise RuntimeError(f"unit {use.unit.name} is read in backward after its scheduled all-gather: "
                               f"the gathers would no longer match across ranks")
        order = use.a_pass.gathers
        due = gathers_due([o.needed for o in order], [o.issued for o in order], order.index(use), self.prefetch)
        for k in due:
            order[k].request, order[k].issued = self.issue(order[k].unit, "backward"), True
        use.full = self.wait(use.request, use.unit, "backward")
        use.request = None
        self.note_gathered()

    def mark_unreached(self, outputs):
        """After a forward pass (plain API): the uses whose saved references backward from
        `outputs` never reads are gathered only to keep every rank in step."""
        last = self.last_pass
        if last is None:
            return
        reached = set()
        for root in outputs:
            for t in topological_order(root):
                saved = getattr(t._node, "saved", ())
                reached.update(id(s.use) for s in getattr(saved, "packed", ()) if isinstance(s, SavedParameter))
        for use in last.gathers:
            use.needed = id(use) in reached
        if not any(use.needed for use in last.gathers):
            self.finish_pass(last)

    def finish_pass(self, a_pass):
        """Issue the pass's backward gathers not yet issued, in order; complete the ones
        nobody here waited for and drop their copies."""
        for use in a_pass.gathers:
            if not use.issued:
                use.request, use.issued = self.issue(use.unit, "backward"), True
            if use.request is not None:
                use.request.wait()
                use.request = None
        self.passes.remove(a_pass)

    def finish(self):
        """End of the step's backward (a sync point every rank reaches alike): issue every
        backward gather still due, in order, and forget the step's passes."""
        for a_pass in list(self.passes):
            self.finish_pass(a_pass)
        self.step_done = True

    # --- communication and its record ------------------------------------------------

    def issue(self, unit, phase):
        self.log(f"gather-{phase}-issue", unit, time.perf_counter())
        return unit.start_gather()

    def wait(self, request, unit, phase):
        start = time.perf_counter()
        full = request.wait()
        self.log(f"gather-{phase}-wait", unit, start)
        return full

    def log(self, kind, unit, start):
        if self.step_done:
            self.reset_peak()
        self.events.append((kind, unit.name, start - self.t0, time.perf_counter() - self.t0))

    def note_gathered(self):
        """Keep the peak of the gathered copies alive now: the completed ones (measured from
        the live arrays) and the buffers of the gathers in flight (prefetched)."""
        uses = [u for a_pass in self.passes for u in a_pass.uses] + self.running
        live = {id(owner(u.full)): owner(u.full).nbytes for u in uses if u.full is not None}
        in_flight = [unit.full_bytes for unit in self.prefetched] + [u.unit.full_bytes for u in uses if u.request]
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, sum(live.values()) + sum(in_flight))

    def reset_peak(self):
        """Forget the peak and the events: a new step's record starts."""
        self.peak_gathered_bytes, self.step_done = 0, False
        self.events, self.t0 = [], time.perf_counter()

    @contextlib.contextmanager
    def full_parameters(self, writeback=False):
        """Every unit gathered for the block (FSDP's summon_full_params): the masters' values
        (float32 under a mixed policy); with writeback, the values the block leaves in the
        parameters become the shards afterwards (and the 16-bit chunks their rounding)."""
        for unit in self.units:
            unit.attach(unit.group.all_gather(unit.bucket.param_shard))
        try:
            yield
        finally:
            for unit in self.units:
                if writeback:
                    keep_chunk(unit.bucket, unit.group.rank)
                unit.free()

    def schedule(self):
        """The all-gathers of one pass as data: [(phase, unit name)] in issue order, as the last
        pass ran (before any: every unit once in order); prefetch only moves when each is
        issued. A unit used twice appears twice; backward gathers the uses in the reverse
        order they finished (a use inside another, BERT's tied embedding inside its head,
        finishes first)."""
        return ([("forward", unit.name) for unit in self.forward_order]
                + [("backward", unit.name) for unit in self.backward_order])


def fully_shard(module, sharding, unit=None, reads=()):
    """Run `module`'s forward as one use of `unit` (in place, as FSDP2's fully_shard: names and
    attributes stay); without a unit, as one forward pass of `sharding`. `reads`: other units
    whose parameters the forward reads (a tied weight passed in, as BERT's MLM head reads the
    token embedding's): each gathered around it too, one more use of that unit in the pass."""
    forward = module.forward
    for other in reads:
        forward = functools.partial(sharding.run_unit, other, forward)

    def sharded_forward(*args, **kwargs):
        if unit is None:
            with sharding.forward_pass():
                return forward(*args, **kwargs)
        return sharding.run_unit(unit, forward, *args, **kwargs)
    module.forward = sharded_forward
    return module
