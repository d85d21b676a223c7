"""`GPTSlice`: the blocks [i, j) of a GPT or BERT and the ends it holds, as a plain Module.

A model cut into `num_stages` consecutive slices is the model again: slice s's output is
slice s + 1's input, and the last one's loss is the whole model's.

    first slice:   idx ─▶ embed ─▶ blocks 0..k-1 ─▶ activation
    middle slice:  activation ─▶ blocks k..l-1 ─▶ activation
    last slice:    activation ─▶ blocks l..n-1 ─▶ head (ln_f, lm_head, cross-entropy) ─▶ loss

A pipeline stage runs one slice; tensor parallelism converts one (the whole model is the
slice 0 of 1). Which parts the ends hold is the model's word (`first_parts`, `last_parts`):
a BERT's last slice also holds the token embedding its MLM head is tied to; when that slice
is not also the first, it holds a copy (a pipeline sums the two copies' gradients:
parallel/pipeline/tied.py).

A slice is built from the model's own modules (the parameters are shared, not copied) and
registers them under the model's attribute names, its blocks under their GLOBAL index, so
`named_parameters()` yields the whole model's names (`blocks.2.attn.q.weight` in the slice
that holds block 2). Every part is looked up as an attribute when the slice runs, so a
tensor-parallel block or embedding with the same forward signature can replace a dense one:
`piece.blocks[2] = tp_block`.

A mixture-of-experts block adds its balancing loss to the model's loss. The last slice adds
its own blocks' to the loss it returns; an earlier slice attaches its blocks' to the
activation it returns (moe_ops.with_aux_loss), so backward from that activation's gradient
also runs from them, with `aux_loss_scale` = d(total loss)/d(aux): 1 for a plain sum, and
what the loss's backward is seeded with when it is not 1 (a pipeline's loss scale /
micro-batches). `last_aux` is the value of the last forward's, for the reported loss.
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
            raise KeyError(f"this slice holds blocks {self.indices()}, not block {index}")
        setattr(self, str(index), block)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class GPTSlice(GPTEnds, nn.Module):
    """Slice `stage` of the `num_stages` consecutive slices of `model`, holding the blocks in
    `block_range`: the first slice holds the embeddings, the last the head.

    `embed` and `head` are the model's own (GPTEnds): they read the parts that a first /
    last slice registers under the model's names."""

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
        """First slice: x is the token indices (B, T); otherwise the activation (B, T, C).
        The last slice returns the mean loss (the logits when targets is None)."""
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
        """Names of the parameters this slice holds that another slice holds too: those of the
        parts both ends hold (BERT's tok_emb), unless this one slice is both ends."""
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
        """Shape of the activation this slice takes or returns for a (batch, seq_len) input:
        known from the config alone, so a pipeline's send/recv need no shape message."""
        return (batch, seq_len, self.config.d_model)

    def __repr__(self):
        return f"GPTSlice({self.stage} of {self.num_stages}, blocks {self.blocks.indices()})"
