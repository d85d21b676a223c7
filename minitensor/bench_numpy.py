"""The numpy limit of `python -m minitensor.bench`: the same GPT training step written by
hand in numpy, with no autograd: one fused forward and one fused backward function per
layer, each keeping only what its backward reads, and the same AdamW arithmetic
(`optim.adamw_update`). No numpy program of this step can do much less work, so the
engine's step over this one's is what the engine's generality costs (its graph, its
Tensor objects, its separate ops).

Checked by `tests/minitensor/test_bench.py`: from the same weights, the loss and every
gradient equal minitensor's (float64, 1e-10).
"""
import math

import numpy as np

from minitensor.optim import adamw_update

GELU_C = math.sqrt(2 / math.pi)


def layer_norm(x, w, b, eps=1e-5):
    """y = x̂·w + b; returns (y, (x̂, 1/σ, w)) as the engine's LayerNorm."""
    xhat = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.vecdot(xhat, xhat)[..., None] / x.shape[-1] + eps)
    xhat *= rstd
    return xhat * w + b, (xhat, rstd, w)


def layer_norm_backward(dy, saved):
    """(dx, dw, db): with g = dy·w, dx = (g − mean g − x̂·mean(g·x̂))/σ."""
    xhat, rstd, w = saved
    n, lead = dy.shape[-1], tuple(range(dy.ndim - 1))
    dy_xhat = dy * xhat
    dw, db = dy_xhat.sum(axis=lead), dy.sum(axis=lead)
    dx = dy * w
    dx -= (dy @ w)[..., None] / n
    dx -= xhat * ((dy_xhat @ w)[..., None] / n)
    dx *= rstd
    return dx, dw, db


def attention(h, p, n_head, mask):
    """Causal multi-head self-attention of `h` (B, T, C) with the weights p[q|k|v|proj]."""
    b, t, c = h.shape
    h2 = h.reshape(-1, c)
    q, k, v = ((h2 @ p[n + ".weight"].T + p[n + ".bias"]).reshape(b, t, n_head, -1).transpose(0, 2, 1, 3)
               for n in ("q", "k", "v"))
    scale = 1.0 / math.sqrt(q.shape[-1])
    a = q @ k.swapaxes(-1, -2)
    a *= scale
    a += mask  # 0, or −∞ above the diagonal
    a -= a.max(axis=-1, keepdims=True)
    np.exp(a, out=a)
    a /= a.sum(axis=-1, keepdims=True)
    y = (a @ v).transpose(0, 2, 1, 3).reshape(-1, c)
    out = y @ p["proj.weight"].T + p["proj.bias"]
    return out.reshape(b, t, c), (h2, q, k, v, a, y, scale)


def attention_backward(dout, saved, p, grads):
    """dh; the weights' gradients into grads[q|k|v|proj]."""
    h2, q, k, v, a, y, scale = saved
    b, n_head, t, d = q.shape
    g = dout.reshape(-1, dout.shape[-1])
    grads["proj.weight"], grads["proj.bias"] = g.T @ y, g.sum(axis=0)
    dy = (g @ p["proj.weight"]).reshape(b, t, n_head, d).transpose(0, 2, 1, 3)
    dv = a.swapaxes(-1, -2) @ dy
    da = dy @ v.swapaxes(-1, -2)
    da -= (da * a).sum(axis=-1, keepdims=True)  # softmax backward: a ⊙ (da − Σ da⊙a)
    da *= a
    da *= scale
    dq, dk = da @ k, da.swapaxes(-1, -2) @ q
    dh = np.zeros_like(h2)
    for name, dz in (("q", dq), ("k", dk), ("v", dv)):
        dz2 = dz.transpose(0, 2, 1, 3).reshape(-1, n_head * d)
        grads[name + ".weight"], grads[name + ".bias"] = dz2.T @ h2, dz2.sum(axis=0)
        dh += dz2 @ p[name + ".weight"]
    return dh.reshape(b, t, -1)


def mlp(h, p):
    """proj(gelu(fc(h))), GPT-2's tanh GELU, in place; keeps gelu's derivative for backward.

    u = c·f·(1 + 0.044715f²), t = tanh u; gelu = ½f(1 + t);
    gelu' = ½(1 + t) + ½f(1 − t²)·c(1 + 3·0.044715f²)."""
    h2 = h.reshape(-1, h.shape[-1])
    f = h2 @ p["fc.weight"].T
    f += p["fc.bias"]
    t = np.multiply(f, f)
    dg = np.multiply(t, 3 * 0.044715)  # 3·0.044715f², before t becomes u
    t *= 0.044715
    t += 1
    t *= f
    t *= GELU_C
    np.tanh(t, out=t)
    dg += 1
    dg *= GELU_C
    dg *= f
    one_minus_t2 = np.multiply(t, t)
    np.subtract(1, one_minus_t2, out=one_minus_t2)
    dg *= one_minus_t2
    dg += 1
    dg += t
    dg *= 0.5
    t += 1
    t *= f
    t *= 0.5  # t is now gelu(f)
    out = t @ p["proj.weight"].T
    out += p["proj.bias"]
    return out.reshape(h.shape), (h2, t, dg)


def mlp_backward(dout, saved, p, grads):
    h2, g, dg = saved
    d2 = dout.reshape(-1, dout.shape[-1])
    grads["proj.weight"], grads["proj.bias"] = d2.T @ g, d2.sum(axis=0)
    df = d2 @ p["proj.weight"]
    df *= dg
    grads["fc.weight"], grads["fc.bias"] = df.T @ h2, df.sum(axis=0)
    return (df @ p["fc.weight"]).reshape(dout.shape)


def cross_entropy(logits, targets):
    """(mean −log softmax(logits)[target], dlogits)."""
    z = logits.reshape(-1, logits.shape[-1])
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=-1, keepdims=True)
    rows, t = np.arange(len(z)), targets.reshape(-1)
    loss = float(np.mean(np.log(total[:, 0]) - z[rows, t]))
    e /= total
    e[rows, t] -= 1
    e /= len(z)
    return loss, e.reshape(logits.shape)


class NumpyGPT:
    """minitensor's GPT (dropout 0) as plain arrays: `loss_and_grads(idx, targets)`."""

    def __init__(self, config, state_dict):
        self.config, self.params = config, {name: np.array(a) for name, a in state_dict.items()}
        dtype = state_dict["lm_head.weight"].dtype
        self.mask = np.triu(np.full((config.block_size, config.block_size), -np.inf, dtype), k=1)

    def block_params(self, layer, part):
        prefix = f"blocks.{layer}.{part}."
        return {name[len(prefix):]: a for name, a in self.params.items() if name.startswith(prefix)}

    def loss_and_grads(self, idx, targets):
        p, cfg, t = self.params, self.config, idx.shape[1]
        x = p["tok_emb.weight"][idx] + p["pos_emb.weight"][:t]
        saved = []
        for layer in range(cfg.n_layer):
            pre = f"blocks.{layer}."
            h, ln_1 = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
            a, attn = attention(h, self.block_params(layer, "attn"), cfg.n_head, self.mask[:t, :t])
            x = x + a
            h, ln_2 = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
            m, ffn = mlp(h, self.block_params(layer, "mlp"))
            x = x + m
            saved.append((ln_1, attn, ln_2, ffn))
        h, ln_f = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        logits = h @ p["lm_head.weight"].T
        loss, dlogits = cross_entropy(logits, targets)
        return loss, self.backward(idx, dlogits, h, ln_f, saved)

    def backward(self, idx, dlogits, h, ln_f, saved):
        p, grads = self.params, {}
        d2 = dlogits.reshape(-1, dlogits.shape[-1])
        grads["lm_head.weight"] = d2.T @ h.reshape(-1, h.shape[-1])
        dx, grads["ln_f.weight"], grads["ln_f.bias"] = layer_norm_backward((d2 @ p["lm_head.weight"]).reshape(h.shape),
                                                                           ln_f)
        for layer in reversed(range(self.config.n_layer)):
            pre, (ln_1, attn, ln_2, ffn) = f"blocks.{layer}.", saved[layer]
            part = {}
            dh = mlp_backward(dx, ffn, self.block_params(layer, "mlp"), part)
            grads.update({pre + "mlp." + n: g for n, g in part.items()})
            dh, grads[pre + "ln_2.weight"], grads[pre + "ln_2.bias"] = layer_norm_backward(dh, ln_2)
            dx = dx + dh
            part = {}
            dh = attention_backward(dx, attn, self.block_params(layer, "attn"), part)
            grads.update({pre + "attn." + n: g for n, g in part.items()})
            dh, grads[pre + "ln_1.weight"], grads[pre + "ln_1.bias"] = layer_norm_backward(dh, ln_1)
            dx = dx + dh
        t = idx.shape[1]
        # the token embedding's gradient: row v sums the rows of dx at the tokens equal to v (a one-hot product)
        one_hot = np.equal.outer(np.arange(len(p["tok_emb.weight"])), idx.reshape(-1)).astype(dx.dtype)
        grads["tok_emb.weight"] = one_hot @ dx.reshape(-1, dx.shape[-1])
        grads["pos_emb.weight"] = np.zeros_like(p["pos_emb.weight"])
        grads["pos_emb.weight"][:t] = dx.sum(axis=0)
        return grads


def numpy_step(config, state_dict, idx, targets, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """A function that runs one training step of the hand-written GPT: loss, gradients,
    AdamW (the bench's lr, minitensor's other defaults) on every parameter."""
    model = NumpyGPT(config, state_dict)
    moments = {name: (np.zeros_like(a), np.zeros_like(a)) for name, a in model.params.items()}
    count = [0]

    def step():
        count[0] += 1
        _, grads = model.loss_and_grads(idx, targets)
        for name, param in model.params.items():
            adamw_update(param, grads[name], *moments[name], count[0], lr, *betas, eps, weight_decay)

    step.model = model  # its arrays, for a test to compare with the engine's
    return step
