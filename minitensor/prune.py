"""Pruning: make a trained GPT or BERT smaller by removing what it needs least.

Unstructured (magnitude) pruning zeroes single weights: the `sparsity` fraction of smallest
|w| among the blocks' matrices, over all of them at once ("global") or in each matrix
alike ("layer"). The shapes stay; a mask remembers the zeros, and fine-tuning re-applies
it after every optimizer step (momentum and weight decay would otherwise revive them):

    pruner = MagnitudePruner(model, sparsity=0.75)      # masks from the trained weights, applied
    loss.backward(); optimizer.step(); pruner.apply()   # each fine-tuning step

Structured pruning removes whole attention heads or MLP neurons: rows of q, k, v (and of
mlp.fc) and the matching INPUT columns of the output projections (attn.proj, mlp.proj),
so every matrix shrinks and the config says the new sizes (n_head with d_head kept,
d_ff). A removed head's or neuron's output was multiplied by those columns only, so the
pruned model computes what the model with them zeroed computes (tests check it).

Why in minitensor and not in parallel: a pruned model is just a smaller model. The
parallel layers shard it as any other, from its config; their one demand — heads and
neurons divisible by tp — is a rule for WHICH ones go (`tp=`: every tp rank's
contiguous share loses as many), decided here, before any sharding.
"""
import dataclasses

import numpy as np

from minitensor import nn

SCOPES = ("global", "layer")


def prunable_weights(model):
    """{name: Parameter}: the matrices of the transformer blocks (embeddings and head stay dense)."""
    return {name: p for name, p in model.named_parameters()
            if name.startswith("blocks.") and name.endswith(".weight") and p.ndim == 2}


def smallest(values, count):
    """A bool mask of the `count` smallest entries of `values` (ties: the first ones)."""
    out = np.zeros(values.size, bool)
    out[np.argsort(values.reshape(-1), kind="stable")[:count]] = True
    return out.reshape(values.shape)


def magnitude_masks(weights, sparsity, scope="global"):
    """{name: bool keep-mask}: round(sparsity · n) weights of smallest |w| are False, with n
    all the weights together ("global") or each matrix's own ("layer")."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"magnitude pruning: sparsity must be in [0, 1), got {sparsity}")
    if scope not in SCOPES:
        raise ValueError(f"magnitude pruning: scope must be one of {SCOPES}, got {scope!r}")
    # exercise 17.2: global magnitude pruning
    # hint: "layer": each matrix keeps all but its round(sparsity·size) smallest |w| (`smallest`);
    # hint: "global": the same over all matrices concatenated, then the mask cut back into their shapes.
    if scope == "layer":
        return {name: ~smallest(np.abs(w.data), round(sparsity * w.size)) for name, w in weights.items()}
    flat = np.concatenate([np.abs(w.data).reshape(-1) for w in weights.values()])
    pruned = smallest(flat, round(sparsity * flat.size))
    ends = np.cumsum([w.size for w in weights.values()])
    return {name: ~pruned[end - w.size:end].reshape(w.shape) for (name, w), end in zip(weights.items(), ends)}
    # end exercise


class MagnitudePruner:
    """Unstructured magnitude pruning of `model`'s block matrices, kept by a fixed mask."""

    def __init__(self, model, sparsity, scope="global"):
        self.weights = prunable_weights(model)
        self.masks = magnitude_masks(self.weights, sparsity, scope)
        self.apply()

    def apply(self):
        """Zero the pruned weights (after every optimizer step of fine-tuning)."""
        for name, w in self.weights.items():
            w.data *= self.masks[name]

    def sparsity(self):
        """The fraction of the prunable weights that are zero now."""
        zeros = sum(int((w.data == 0).sum()) for w in self.weights.values())
        return zeros / sum(w.size for w in self.weights.values())


# --- structured: heads and neurons -----------------------------------------------------

def head_scores(attn, head_dim):
    """(n_head,) L2 norm of each head's weights: its rows of q, k, v and its columns of proj."""
    rows = sum(np.square(lin.weight.data).reshape(-1, head_dim, lin.weight.shape[1]).sum(axis=(1, 2))
               for lin in (attn.q, attn.k, attn.v))
    columns = np.square(attn.proj.weight.data).reshape(attn.proj.weight.shape[0], -1, head_dim).sum(axis=(0, 2))
    return np.sqrt(rows + columns)


def neuron_scores(mlp):
    """(d_ff,) L2 norm of each hidden neuron's weights: its row of fc and its column of proj."""
    return np.sqrt(np.square(mlp.fc.weight.data).sum(axis=1) + np.square(mlp.proj.weight.data).sum(axis=0))


def lowest_per_rank(scores, count, tp, what):
    """Indices of `count` units to remove, the lowest-scoring `count / tp` in each tp rank's
    contiguous share of `scores`, so the rest stay evenly split over the same ranks."""
    total = len(scores)
    if not 0 <= count < total:
        raise ValueError(f"prune {what}: can remove 0 to {total - 1} of {total}, got {count}")
    if total % tp or count % tp:
        raise ValueError(f"prune {what}: removing {count} of {total} under tp={tp} must take the same number "
                         f"from each tp rank's share: both numbers must be divisible by tp")
    share = total // tp
    return sorted(int(r * share + i) for r, part in enumerate(scores.reshape(tp, share))
                  for i in np.argsort(part, kind="stable")[:count // tp])


def keep(linear, index, axis):
    """Keep only entries `index` of `linear`'s output (axis 0: weight rows and bias) or input (axis 1)."""
    linear.weight = nn.Parameter(np.take(linear.weight.data, index, axis=axis))
    if axis == 0 and linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[index])
    linear.out_features, linear.in_features = linear.weight.shape


def units_to_prune(model, kind, count, tp=1):
    """{block index: [indices]} of the `count` lowest-scoring "heads" or "neurons" of every block."""
    scores = {"heads": lambda block: head_scores(block.attn, model.config.head_dim),
              "neurons": lambda block: neuron_scores(block.mlp)}
    if kind not in scores:
        raise ValueError(f"prune: kind must be 'heads' or 'neurons', got {kind!r}")
    return {i: lowest_per_rank(scores[kind](block), count, tp, f"{kind} of block {i}")
            for i, block in enumerate(model.blocks)}


def check_same_count(removed, kind):
    counts = {len(units) for units in removed.values()}
    if len(counts) > 1:
        raise ValueError(f"prune {kind}: every block must lose as many (one config for all), got {removed}")
    return counts.pop() if counts else 0


def prune_heads(model, removed):
    """Remove the heads `removed` = {block index: [heads]} (as many in every block); new parameters,
    so build the optimizer afterwards. model.config: n_head shrinks, d_head is kept."""
    head_dim, n_head = model.config.head_dim, model.config.n_head
    count = check_same_count(removed, "heads")
    # exercise 17.3: remove attention heads
    # hint: keep the other heads' rows of q, k, v (and their bias entries), head h being rows h·d_head .. (h+1)·d_head,
    # hint: and the same COLUMNS of attn.proj (its input); then attn.n_head and the config's n_head and d_head.
    for i, heads in removed.items():
        attn = model.blocks[i].attn
        kept = [h for h in range(n_head) if h not in heads]
        index = (np.array(kept)[:, None] * head_dim + np.arange(head_dim)).reshape(-1)
        for lin in (attn.q, attn.k, attn.v):
            keep(lin, index, axis=0)
        keep(attn.proj, index, axis=1)
        attn.n_head = len(kept)
    model.config = dataclasses.replace(model.config, n_head=n_head - count, d_head=head_dim)
    # end exercise
    return model


def prune_neurons(model, removed):
    """Remove the MLP neurons `removed` = {block index: [neurons]} (as many in every block):
    rows of mlp.fc, columns of mlp.proj; model.config.d_ff shrinks."""
    width = model.config.mlp_width
    count = check_same_count(removed, "neurons")
    for i, neurons in removed.items():
        mlp = model.blocks[i].mlp
        index = np.setdiff1d(np.arange(width), neurons)
        keep(mlp.fc, index, axis=0)
        keep(mlp.proj, index, axis=1)
    model.config = dataclasses.replace(model.config, d_ff=width - count)
    return model
