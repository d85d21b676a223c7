"""`Pipeline`: run any schedule's action list on this rank's stages.

The schedule (schedules.py) is data: for this rank, an ordered list of
recv_fwd / forward / send_fwd / recv_bwd / backward / send_bwd actions on
(micro-batch, chunk). The executor replays it with blocking `send`/`recv`, exactly
the semantics under which checker.py proved the lists deadlock-free:

    recv_fwd   receive the activation (micro_batch, T, d_model) into a fresh buffer: a leaf
               that requires grad, so backward yields its gradient
    forward    run the stage on it (first stage: on the token indices); the last stage
               returns the micro-batch's mean loss
    send_fwd   send the output, drop its values (its graph is still needed, Megatron-LM's
               deallocate_output_tensor)
    recv_bwd   receive the gradient of the output
    backward   last stage: backward from loss · loss_scale / m (the loss scaler's scale,
               minitensor.amp, or 1); else from the received gradient; frees the graph
    send_bwd   send the input's gradient to the previous stage
    backward_input   (zero-bubble schedules) the backward's B half: the input's gradient now;
               the W half waits in a WeightGradStore (minitensor.split_backward)
    backward_weight  its W half: the stage's weight gradients of that micro-batch
Under DualPipeV (placement "v") stages p-1 and p are both on rank p-1: the forward of the
one hands its output to the other in memory (a fresh leaf, as if received), and the
backward of stage p hands its input's gradient back the same way; no message travels.
Under DualPipe (placement "mirror") the first m/2 micro-batches run down the ranks' chunk 0,
the others up chunk 1: the losses are on rank p-1 and rank 0.

Message shapes and dtypes are known on every rank from the config and the batch: no shape
travels. Scaling each micro-batch loss by 1/m makes the accumulated gradients those of the
mean loss over the global batch, the single-device model's.

`train_step` zeroes the stages' gradients, runs the list, and returns the mean loss on
every rank. The optimizer step is the caller's (under DualPipe after HybridGPT summed each
stage's two copies' gradients, tied.MirroredGradients):

    pipe = Pipeline.from_gpt(model, group, microbatches=4, schedule="1f1b")
    opt = AdamW(pipe.parameters())
    loss = pipe.train_step(idx, targets); opt.step()
"""
import time

import numpy as np

from minitensor.dtypes import is_floating
from minitensor.recompute import recompute
from minitensor.split_backward import WeightGradStore, backward_input
from minitensor.tensor import Tensor

from ..comm.checks import TAG_UB
from ..comm.gather import gather_named_arrays
from .memory import ActivationMeter, activation_bytes
from .partition import stages_for_rank
from .placement import num_stages, rank_and_chunk, stage_of
from .registry import get_schedule, placement_of
from .schedules import KINDS
from .timeline import Event, Timeline, all_gather_events, bubble_theory


class Pipeline:
    """This rank's part of a pipeline: its stages (one per model chunk) and its actions.

    stages: the GPTSlice(s) of this rank in chunk order (chunk c is model stage
    c·p + rank; under "dualpipev" rank and 2p-1-rank); group: the pipeline group (p = group.size ranks); microbatches: m;
    schedule: "gpipe", "1f1b", "interleaved" (len(stages) > 1 chunks), the zero-bubble "zb-h1" / "zb-h2"
    (zero_bubble.py), "dualpipev" or "dualpipe" (two chunks: the V, the two directions; dualpipe.py);
    recompute: recompute each stage's forward in its backward, so a stored
    micro-batch costs only its stage input (GPipe's re-materialisation).
    """

    def __init__(self, stages, group, microbatches, schedule="1f1b", recompute=False):
        self.stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        self.group, self.m, self.v = group, microbatches, len(self.stages)
        self.p, self.rank = group.size, group.rank
        self.schedule, self.recompute, self.placement = schedule, recompute, placement_of(schedule)
        self.actions = get_schedule(schedule, self.p, microbatches, self.v)[self.rank]
        self._check_stages()
        self.events, self.meter = [], ActivationMeter()
        self.loss_scale = 1.0  # set before each step by a loss scaler (minitensor.amp)
        # a mixture of experts: any stage may add MoE losses to the reported loss (the same on every rank)
        self.has_experts = bool(getattr(self.stages[0].config, "n_experts", 0))

    @classmethod
    def from_gpt(cls, model, group, microbatches, schedule="1f1b", chunks=1, balance=None, recompute=False):
        """Cut the dense `model` into group.size · chunks stages (balance: blocks per
        stage, default by parameter count) and keep this rank's."""
        twice = ("ties parameters across its first and last stage" if set(model.first_parts) & set(model.last_parts)
                 else f"holds every stage twice under {schedule!r}" if placement_of(schedule) == "mirror" else None)
        if twice and group.size > 1:
            raise ValueError(f"{model.config.name} {twice}, whose gradients must be "
                             f"summed after backward: use HybridGPT(model, Mesh(1, 1, {group.size}))")
        stages = stages_for_rank(model, group.rank, group.size, chunks, balance, placement_of(schedule))
        return cls(stages, group, microbatches, schedule, recompute)

    def _check_stages(self):
        total = num_stages(self.p, self.v, self.placement)
        for chunk, stage in enumerate(self.stages):
            expected = stage_of(self.rank, chunk, self.p, self.placement)
            if (stage.stage, stage.num_stages) != (expected, total):
                raise ValueError(f"rank {self.rank} of a {self.p}-rank pipeline with {self.v} chunk(s) needs "
                                 f"stage {expected} of {total} as chunk {chunk}, "
                                 f"got stage {stage.stage} of {stage.num_stages}")

    # --- the module interface ------------------------------------------------------

    def named_parameters(self):
        return [item for stage in self.stages for item in stage.named_parameters()]

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for stage in self.stages:
            stage.zero_grad()

    def full_state_dict(self):
        """Collective over the pipeline group: every parameter, single-device names."""
        return gather_named_arrays(self.group, {n: p.data for n, p in self.named_parameters()})

    def full_grads(self):
        """Collective over the pipeline group: every gradient, single-device names."""
        return gather_named_arrays(self.group, {n: p.grad for n, p in self.named_parameters()
                                                if p.grad is not None})

    # --- one training step ---------------------------------------------------------

    def train_step(self, idx, targets, zero_grad=True):
        """Forward and backward of the global batch idx (B, T) with targets (B, T) in
        m micro-batches; returns the mean loss (on every rank). Gradients are left in
        the parameters' .grad for the caller's optimizer; with zero_grad=False they add
        to the ones already there (gradient accumulation across steps)."""
        idx, targets = np.asarray(idx), np.asarray(targets)
        if idx.ndim != 2 or targets.shape != idx.shape:
            raise ValueError(f"train_step needs idx and targets of the same shape (B, T), "
                             f"got {idx.shape} and {targets.shape}")
        if idx.shape[0] % self.m:
            raise ValueError(f"batch size {idx.shape[0]} is not divisible by microbatches={self.m}")
        if zero_grad:
            self.zero_grad()
        for stage in self.stages:  # what backward gives an early stage's MoE losses (GPTSlice)
            stage.aux_loss_scale = self.loss_scale / self.m
        step = _Step(self, np.split(idx, self.m), np.split(targets, self.m))
        self.meter, self.events = step.meter, []
        self.group.barrier()  # a common time origin for every rank's events
        t0 = self.t0 = time.perf_counter()  # kept: other timed work of the step is drawn against it
        for action in self.actions:
            start = time.perf_counter()
            step.run(action)
            self.events.append(Event(self.rank, action.kind, action.microbatch, action.chunk,
                                     start - t0, time.perf_counter() - t0))
        step.check_all_freed()
        return self._reported_loss(step.losses, step.aux)

    def _reported_loss(self, losses, aux):
        """The mean loss (a rank's part: sum / m) from the last stage's rank, or summed over the ranks (DualPipe:
        two last stages; MoE: plus `aux`, this rank's balancing losses of the stages before the last)."""
        value = np.array([np.sum(losses) / self.m])
        last = num_stages(self.p, self.v, self.placement) - 1
        last_ranks = {rank_and_chunk(last, self.p, self.placement, chunk)[0] for chunk in range(self.v)}
        if not self.has_experts and len(last_ranks) == 1:
            return float(self.group.broadcast(value, root=last_ranks.pop())[0])
        return float(self.group.all_reduce(value + aux / self.m)[0])

    # --- what the step did ---------------------------------------------------------

    @property
    def peak_activations(self):
        """Most (micro-batch, chunk) graphs this rank held at once in the last step."""
        return self.meter.peak_count

    @property
    def peak_activation_bytes(self):
        return self.meter.peak_bytes

    def timeline(self):
        """Collective: the last step's events of every rank, as a Timeline."""
        return Timeline(all_gather_events(self.group, self.events), num_ranks=self.p)

    def bubble(self):
        """Collective: (measured, theoretical) bubble fraction of the last step."""
        return self.timeline().bubble_fraction(), bubble_theory(self.p, self.m, self.v, self.schedule)


def message_tag(microbatch, to_stage, backward, num_stages):
    """A tag naming the message (micro-batch, receiving stage, direction). Matching
    follows the list order anyway; the tag makes a mismatch fail loudly instead of
    delivering the wrong tensor. Wraps modulo MPI's guaranteed tag range."""
    return (2 * (microbatch * num_stages + to_stage) + backward) % (TAG_UB - 1)


def drop_values(out):
    """Once sent (or handed over), backward needs the output's graph, not its values: keep shape and dtype only."""
    out.data = np.broadcast_to(np.zeros((), out.dtype), out.shape)


class _Step:
    """The state of one train_step on one rank: what each action reads and leaves."""

    def __init__(self, pipe, idx_chunks, target_chunks):
        self.pipe, self.idx, self.targets = pipe, idx_chunks, target_chunks
        self.inputs, self.outputs, self.output_grads, self.input_grads = {}, {}, {}, {}
        self.losses, self.meter, self.weight_grads = [], ActivationMeter(), WeightGradStore()
        self.aux = 0.0  # the MoE losses of this rank's stages before the last, summed over micro-batches
        first = pipe.stages[0]
        self.shape = first.activation_shape(*idx_chunks[0].shape)
        self.dtype = next(p.dtype for p in first.parameters() if is_floating(p.dtype))
        self.num_stages = num_stages(pipe.p, pipe.v, pipe.placement)
        self.handlers = {kind: getattr(self, kind) for kind in KINDS}  # what each kind does: a method below

    def run(self, action):
        self.handlers[action.kind](action.microbatch, action.chunk, action.peer)

    def stage_id(self, chunk):
        return stage_of(self.pipe.rank, chunk, self.pipe.p, self.pipe.placement)

    def chunk_here(self, stage, direction):
        """This rank's chunk holding `stage` (going `direction`, the chunk of a micro-batch under
        "mirror"), or None (another rank's, or no such stage)."""
        if not 0 <= stage < self.num_stages:
            return None
        rank, chunk = rank_and_chunk(stage, self.pipe.p, self.pipe.placement, direction)
        return chunk if rank == self.pipe.rank else None

    def recv_fwd(self, mb, chunk, peer):
        buffer = np.empty(self.shape, self.dtype)
        tag = message_tag(mb, self.stage_id(chunk), 0, self.num_stages)
        self.inputs[mb, chunk] = Tensor(self.pipe.group.recv(buffer, peer, tag), requires_grad=True)

    def forward(self, mb, chunk, peer):
        stage = self.pipe.stages[chunk]
        x = self.idx[mb] if stage.is_first else self.inputs[mb, chunk]
        targets = self.targets[mb] if stage.is_last else None
        if self.pipe.recompute:  # the recomputation in backward replays the stage's random streams
            out = recompute(stage, x, targets, generators=stage.generators())
        else:
            out = stage(x, targets)
        if stage.is_last:
            self.losses.append(out.item())
        else:
            self.aux += stage.last_aux
        self.outputs[mb, chunk] = out
        self.meter.stored((mb, chunk), activation_bytes(out))
        following = self.chunk_here(self.stage_id(chunk) + 1, chunk)
        if following is not None:  # the V's turn: the next stage is here, a leaf as if received
            self.inputs[mb, following] = Tensor(out.data, requires_grad=True)
            drop_values(out)

    def send_fwd(self, mb, chunk, peer):
        out = self.outputs[mb, chunk]
        self.pipe.group.send(out.data, peer, message_tag(mb, self.stage_id(chunk) + 1, 0, self.num_stages))
        drop_values(out)

    def recv_bwd(self, mb, chunk, peer):
        buffer = np.empty(self.shape, self.dtype)
        tag = message_tag(mb, self.stage_id(chunk), 1, self.num_stages)
        self.output_grads[mb, chunk] = self.pipe.group.recv(buffer, peer, tag)

    def output_grad(self, mb, chunk, out):
        """Where backward from `out` starts: scale/m on the loss (last stage), in the loss's
        dtype (float32 for 16-bit stages); else the received gradient."""
        if self.pipe.stages[chunk].is_last:
            return np.asarray(self.pipe.loss_scale / self.pipe.m, out.dtype)
        return self.output_grads.pop((mb, chunk))

    def backward(self, mb, chunk, peer):
        out = self.outputs.pop((mb, chunk))
        out.backward(self.output_grad(mb, chunk, out))
        self.meter.freed((mb, chunk))
        self.keep_input_grad(mb, chunk)

    def backward_input(self, mb, chunk, peer):
        inputs = [self.inputs[mb, chunk]] if (mb, chunk) in self.inputs else []
        out = self.outputs.pop((mb, chunk))
        weights = backward_input(out, self.output_grad(mb, chunk, out), inputs)
        self.weight_grads.put((mb, chunk), weights)
        self.meter.stored((mb, chunk), weights.saved_bytes())  # what W still needs, until W
        self.keep_input_grad(mb, chunk)

    def backward_weight(self, mb, chunk, peer):
        self.weight_grads.run((mb, chunk))
        self.meter.freed((mb, chunk))

    def keep_input_grad(self, mb, chunk):
        if (mb, chunk) in self.inputs:
            grad = self.inputs.pop((mb, chunk)).grad
            preceding = self.chunk_here(self.stage_id(chunk) - 1, chunk)
            if preceding is None:
                self.input_grads[mb, chunk] = grad
            else:  # the V's turn, backwards: the previous stage is here
                self.output_grads[mb, preceding] = grad

    def send_bwd(self, mb, chunk, peer):
        grad = self.input_grads.pop((mb, chunk))
        self.pipe.group.send(grad, peer, message_tag(mb, self.stage_id(chunk) - 1, 1, self.num_stages))

    def check_all_freed(self):
        left = {name: list(d) for name, d in (("inputs", self.inputs), ("outputs", self.outputs),
                                               ("output grads", self.output_grads),
                                               ("input grads", self.input_grads),
                                               ("weight gradients", self.weight_grads.pending)) if d}
        if left:
            raise RuntimeError(f"rank {self.pipe.rank}: the schedule left {left} unconsumed")
