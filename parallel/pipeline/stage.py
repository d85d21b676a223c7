"""`PipelineStage`: the slice of a GPT that one pipeline stage runs, as a plain Module.

    stage 0:       idx ─▶ embed ─▶ blocks 0..k-1 ─▶ activation
    middle stage:  activation ─▶ blocks k..l-1 ─▶ activation
    last stage:    activation ─▶ blocks l..n-1 ─▶ head (ln_f, lm_head, cross-entropy) ─▶ loss

Which parts the ends hold is the model's word (`first_parts`, `last_parts`): a BERT's last
stage also holds the token embedding its MLM head is tied to; on another rank than the
first stage that is a copy, whose gradient `tied.TiedGradients` sums with the first's.

A stage is built from the dense GPT's own modules (the parameters are shared, not
copied) and registers them under the dense model's attribute names, its blocks under
their GLOBAL index, so `named_parameters()` yields single-device names
(`blocks.2.attn.q.weight` on the stage that holds block 2). Every part is looked up as
an attribute when the stage runs, so a tensor-parallel block or embedding with the same
forward signature can replace a dense one: `stage.blocks[2] = tp_block`.

A mixture-of-experts block adds its balancing loss to the model's loss. The last stage
adds its own blocks' to the loss it returns; an earlier stage attaches its blocks' to the
activation it sends (moe_ops.with_aux_loss), so backward from the received gradient also
runs from them, with `aux_loss_scale` (loss scale / micro-batches: what the pipeline seeds
the loss with). `last_aux` is the value of the last forward's, for the reported loss.
"""
from minitensor import nn
from minitensor.models.gpt import GPTEnds, moe_loss
from minitensor.nn.moe import MoE
from minitensor.nn.moe_ops import with_aux_loss


class GlobalBlocks(nn.Module):
    """Transformer blocks registered under their index in the whole model."""

    def __init__(self, blocks_by_index):
        super().__init__()
        for index, block in blocks_by_index.items():
            setattr(self, str(index), block)

    def indices(self):
        return [int(name) for name in self._modules]

    def __getitem__(self, index):
        return self._modules[str(index)]

    def __setitem__(self, index, block):
        if str(index) not in self._modules:
            raise KeyError(f"this stage holds blocks {self.indices()}, not block {index}")
        setattr(self, str(index), block)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class PipelineStage(GPTEnds, nn.Module):
    """Stage `stage` of `num_stages` of `model`, holding the blocks in `block_range`.

    `embed` and `head` are the GPT's own (GPTEnds): they read the parts that a first /
    last stage registers under the GPT's names."""

    def __init__(self, model, block_range, stage, num_stages):
        super().__init__()
        self.config = model.config
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.first_parts, self.last_parts, self.tied_reads = model.first_parts, model.last_parts, model.tied_reads
        for name in self.first_parts if self.is_first else ():
            setattr(self, name, getattr(model, name))
        self.blocks = GlobalBlocks({i: model.blocks[i] for i in block_range})
        for name in self.last_parts if self.is_last else ():
            setattr(self, name, getattr(model, name))
        self.aux_loss_scale, self.last_aux = 1.0, 0.0

    def has_experts(self):
        return any(isinstance(block.mlp, MoE) for block in self.blocks)

    def forward(self, x, targets=None):
        """First stage: x is the token indices (B, T); otherwise the activation (B, T, C).
        The last stage returns the mean loss (the logits when targets is None)."""
        if self.is_first:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        aux = moe_loss(self.blocks) if self.has_experts() else None
        self.last_aux = aux.item() if aux is not None else 0.0
        if not self.is_last:
            return x if aux is None else with_aux_loss(x, aux, self.aux_loss_scale)
        logits, loss = self.head(x, targets)
        if targets is None:
            return logits
        return loss if aux is None else loss + aux.to(loss.dtype)

    def tied_names(self):
        """Names of the parameters this stage holds that another stage holds too: those of the
        parts both ends hold (BERT's tok_emb), unless this one stage is both ends."""
        if self.is_first == self.is_last:
            return []
        shared = set(self.first_parts) & set(self.last_parts)
        return [name for name, _ in self.named_parameters() if name.split(".")[0] in shared]

    def generators(self):
        """The random generators forward draws from besides minitensor's default one: an
        activation recomputation replays them with it, so a recomputation draws the same
        dropout masks. None here (dense dropout draws from the default generator)."""
        return ()

    def activation_shape(self, batch, seq_len):
        """Shape of the activation this stage sends or receives for a (batch, seq_len)
        micro-batch: known on every rank, so send/recv need no shape message."""
        return (batch, seq_len, self.config.d_model)

    def __repr__(self):
        return f"PipelineStage({self.stage} of {self.num_stages}, blocks {self.blocks.indices()})"
