"""`ParallelModel`: what the checkpoints, the training job and its report need of a parallel model.

They never ask which mechanisms a model composes; they call these names. `HybridGPT`
(dp × tp × pp × cp) is the implementation; a new layout joins by providing the same names.

    config, mesh, optimizer      the GPTConfig (or BertConfig), the Mesh, the optimizer (None before configure_optimizer)
    dense_class                  the single-device model class (GPT or BERT)
    layout()                     the layout's switches as a JSON-able dict (kept in checkpoints)
    named_parameters()           this rank's parameters by single-device name; a tensor-parallel
                                 shard is described by tensor_parallel.sharding.tp_axis / dense_shape
    named_modules()              this rank's modules by name (where the dropout generators live)
    amp                          its minitensor.amp.MixedPrecision: precision policy, masters, loss scaler
    comm_hook, outer             per-rank states a checkpoint keeps (None when unused): the dp gradient
                                 compressor (parallel.data_parallel.comm_hooks) and local SGD's outer
                                 optimizer (parallel.data_parallel.local_sgd)
    step_updates                 [(single-device module name, state)]: what moves after each optimizer
                                 step outside the gradient (Module.step_updates: a mixture of
                                 experts' loss-free balancing bias); checkpoints keep their state_dicts
    named_master_parameters()    the parameters the optimizer steps, by name (float32 masters under
                                 a mixed precision policy; else the parameters); checkpoints hold these
    master_parameters_changed()  a loader wrote the masters: refresh the compute copies
    train_step(idx, targets)     forward + backward of one global batch, gradients ADDED; mean loss
    global_microbatches(idx, targets)
                                 the global batch as its micro-batch steps take it, over every rank
    finish_grad_sync()           every gradient reduction due (idempotent)
    optimizer_step(), zero_grad()
    full_state_dict(), full_grads(), load_full_state_dict(state), dense_gpt()
                                 the single-device view (collectives over the whole mesh)
    events()                     the last step's pipeline timeline events of this rank
    communication_stats(), reset_communication_stats()
                                 {(group name, kind): {calls, elements, bytes}} on this rank
    full_parameters(writeback)   a context in which every local parameter holds its values
                                 (ZeRO-3 gathers them; written back to the shards with writeback)
"""
import contextlib
from abc import ABC, abstractmethod

from minitensor.models.gpt import GPT

from ..comm.gather import all_gather_json


class ParallelModel(ABC):
    config = mesh = optimizer = amp = comm_hook = outer = None
    step_updates = ()
    dense_class = GPT

    @abstractmethod
    def layout(self):
        """{"dp": .., "tp": .., "pp": .., and every switch that shapes the computation}."""

    @abstractmethod
    def named_parameters(self):
        """[(single-device name, Parameter)] of this rank."""

    @abstractmethod
    def named_modules(self):
        """[(name, Module)] of this rank, each module once."""

    @abstractmethod
    def train_step(self, idx, targets):
        """Forward and backward of one global batch (B, T); returns its mean loss on every rank."""

    @abstractmethod
    def finish_grad_sync(self):
        """Run every gradient reduction that is due; a no-op when none is."""

    @abstractmethod
    def optimizer_step(self):
        """Finish the gradient sync, step the optimizer, zero the gradients."""

    @abstractmethod
    def full_state_dict(self):
        """Single-device-named parameters, gathered on every rank."""

    @abstractmethod
    def full_grads(self):
        """Single-device-named gradients of the synced step, gathered on every rank."""

    @abstractmethod
    def load_full_state_dict(self, state):
        """Load single-device-named parameters: each rank keeps its own pieces."""

    @abstractmethod
    def events(self):
        """This rank's timeline events of the last step (pipeline.timeline.Event)."""

    @abstractmethod
    def communication_stats(self):
        """{(group name, kind): {"calls", "elements", "bytes"}} on this rank since the last reset."""

    @abstractmethod
    def reset_communication_stats(self):
        """Start counting communication afresh."""

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def global_microbatches(self, idx, targets):
        """[(idx, targets)] of each micro-batch step over every rank (one device runs the same
        ones under --check); default: the whole batch in one step."""
        return [(idx, targets)]

    def full_parameters(self, writeback=False):
        return contextlib.nullcontext()

    def named_master_parameters(self):
        return self.named_parameters()

    def master_parameters_changed(self):
        """Nothing to do when the parameters are their own masters."""

    def dense_gpt(self):
        """A single-device GPT (or BERT) holding the gathered parameters and step_updates' states
        (a MoE layer's routing bias: it picks the experts) on every rank, in eval mode."""
        model = self.dense_class(self.config, dtype=self.parameters()[0].dtype)
        model.load_state_dict(self.full_state_dict())
        states = {}
        for part in all_gather_json(self.mesh.world, {name: u.state_dict() for name, u in self.step_updates}):
            states.update(part)
        for name, module in model.named_modules():
            for update in module.step_updates():
                update.load_state_dict(states[name])
        return model.eval()

    def num_parameters(self):
        return sum(p.size for p in self.parameters())
