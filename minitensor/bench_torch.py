"""The PyTorch side of `python -m minitensor.bench`: the same GPT, parameter for parameter,
in PyTorch eager, and its training step. torch is optional: it is imported only inside
these functions, and `torch_step` gives None without it."""
import math

import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT


def torch_gpt(config):
    """The same GPT as `minitensor.models.gpt`, parameter for parameter, in PyTorch eager.

    Attention is written out (q kᵀ, causal mask, softmax, @ v) as minitensor computes it.
    """
    import torch
    from torch import nn
    from torch.nn import functional as TF

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            d = config.d_model
            self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
            self.register_buffer("mask", torch.ones(config.block_size, config.block_size).triu(1).bool(), persistent=False)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (f(x).view(b, t, config.n_head, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            weights = scores.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
            return self.proj((weights @ v).transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = config.d_model
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), Attention(), nn.LayerNorm(d)
            self.mlp = nn.Module()
            self.mlp.fc, self.mlp.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp.proj(TF.gelu(self.mlp.fc(self.ln_2(x)), approximate="tanh"))

    class TorchGPT(nn.Module):
        def __init__(self):
            super().__init__()
            d = config.d_model
            self.tok_emb, self.pos_emb = nn.Embedding(config.vocab_size, d), nn.Embedding(config.block_size, d)
            self.blocks = nn.ModuleList(Block() for _ in range(config.n_layer))
            self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, config.vocab_size, bias=False)

        def forward(self, idx, targets):
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return TF.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return TorchGPT()


def torch_step(config, idx, targets, threads):
    """The same training step in PyTorch eager on the batch (idx, targets) (checked: same
    loss from the same weights), or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    model = torch_gpt(config)
    mt.manual_seed(0)
    reference = GPT(config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in reference.state_dict().items()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    expected = reference(idx, targets)[1].item()
    idx, targets = torch.from_numpy(idx), torch.from_numpy(targets)
    with torch.no_grad():
        got = model(idx, targets).item()
    if not np.isclose(got, expected, rtol=1e-4):
        raise RuntimeError(f"PyTorch model gives loss {got}, minitensor {expected}: not the same architecture")

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(idx, targets).backward()
        optimizer.step()

    return step
