"""The tiles of causal attention over T = 10 tokens in tiles of 4 queries × 3 keys: which are
computed whole, which cross the diagonal (masked inside), which are skipped; then flash
attention against the dense kernel in float64 (output, L, every gradient) with these tiles,
and a GPT computing its attention by flash against the same GPT with the dense kernel.

    python tutorials/21_flash_attention/tiles.py
"""
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig, use_attention
from minitensor.nn import functional as F
from minitensor.nn.attention_kernels import attention_kernel
from minitensor.nn.flash_attention import flash_attention, tiles, visible

T, BLOCK_Q, BLOCK_K = 10, 4, 3
MARKS = {"full": "#", "diagonal": "\\", "skipped": "."}


def tile_kinds(t, block_q, block_k, causal=True):
    """kinds[i][j]: "full", "diagonal" (crosses it: masked inside) or "skipped" for Q tile i, K tile j."""
    return [["skipped" if not visible(rows, cols, causal) else
             "diagonal" if causal and cols.stop - 1 > rows.start else "full"
             for cols in tiles(t, block_k)] for rows in tiles(t, block_q)]


def attention_and_grads(kernel, arrays, grad):
    q, k, v = (mt.tensor(a, requires_grad=True) for a in arrays)
    out, lse = (flash_attention(q, k, v, causal=True, block_q=BLOCK_Q, block_k=BLOCK_K, return_lse=True)
                if kernel == "flash" else (F.scaled_dot_product_attention(q, k, v, causal=True), None))
    out.backward(grad)
    return out.data, lse, q.grad, k.grad, v.grad


def gpt_loss_and_grads(kernel):
    config = GPTConfig(vocab_size=11, block_size=T, n_layer=2, n_head=2, d_model=8)
    mt.manual_seed(0)
    model = use_attention(GPT(config).double(), kernel)
    rng = np.random.default_rng(0)
    _, loss = model(rng.integers(0, 11, (2, T)), rng.integers(0, 11, (2, T)))
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def main():
    kinds = tile_kinds(T, BLOCK_Q, BLOCK_K)
    print(f"causal, T = {T}, tiles of {BLOCK_Q} queries x {BLOCK_K} keys "
          f"(# whole, \\ crosses the diagonal, . skipped):")
    for rows, row in zip(tiles(T, BLOCK_Q), kinds):
        print(f"  queries {rows.start:2d}-{rows.stop - 1:2d}  " + " ".join(MARKS[kind] for kind in row))
    counts = {kind: sum(row.count(kind) for row in kinds) for kind in MARKS}
    print(f"tiles: {counts['full']} whole, {counts['diagonal']} on the diagonal, {counts['skipped']} skipped "
          f"of {sum(counts.values())}")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3, T, 4)) for _ in range(3)]
    grad = rng.standard_normal((2, 3, T, 4))
    flash, dense = attention_and_grads("flash", arrays, grad), attention_and_grads("dense", arrays, grad)
    scores = np.where(np.tril(np.ones((T, T), bool)), arrays[0] @ arrays[1].swapaxes(-1, -2) / 2.0, -np.inf)
    print("flash vs dense, float64, largest difference of output, dq, dk, dv: "
          + ", ".join(f"{np.abs(a - b).max():.1e}" for i, (a, b) in enumerate(zip(flash, dense)) if i != 1)
          + f"; of L vs log-sum-exp: {np.abs(flash[1].data - np.logaddexp.reduce(scores, axis=-1)).max():.1e}")
    (loss, grads), (ref_loss, ref_grads) = (gpt_loss_and_grads(attention_kernel(name, 3)) for name in ("flash", "dense"))
    print(f"GPT with flash attention vs dense: loss difference {abs(loss - ref_loss):.1e}, largest gradient "
          f"difference {max(np.abs(a - b).max() for a, b in zip(grads, ref_grads)):.1e}")


if __name__ == "__main__":
    main()
