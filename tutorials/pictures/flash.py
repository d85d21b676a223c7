"""Chapter 21's pictures, from its scripts' own functions: the tiles of causal flash attention
(computed whole, crossing the diagonal, skipped), and the bytes saved for backward against T,
dense vs flash, by the engine's count."""
import numpy as np

from .draw import Picture, load_script

KIND_VALUES = {"skipped": 0, "diagonal": 1, "full": 2}


def tile_grid(quick):
    script = load_script("21_flash_attention/tiles.py")
    kinds = script.tile_kinds(script.T, script.BLOCK_Q, script.BLOCK_K)
    text = "\n".join("  " + " ".join(script.MARKS[k] for k in row) for row in kinds)
    return (kinds, script.T, script.BLOCK_Q, script.BLOCK_K), f"tiles (# whole, \\ diagonal, . skipped):\n{text}"


def draw_tiles(plt, data):
    kinds, t, block_q, block_k = data
    fig, ax = plt.subplots(figsize=(4.5, 4))
    colours = {"full": "#4c72b0", "diagonal": "#dd8452", "skipped": "#eeeeee"}
    for i, row in enumerate(kinds):
        for j, kind in enumerate(row):
            r0, c0 = i * block_q, j * block_k
            h, w = min(block_q, t - r0), min(block_k, t - c0)
            ax.add_patch(plt.Rectangle((c0, r0), w, h, facecolor=colours[kind], edgecolor="black"))
            ax.text(c0 + w / 2, r0 + h / 2, kind, ha="center", va="center", fontsize=7)
    ax.plot([0, t], [0, t], color="black", linestyle=":")  # the diagonal: key = query
    ax.set(xlim=(0, t), ylim=(t, 0), xlabel="keys (tiles of B_c)", ylabel="queries (tiles of B_r)",
           title=f"causal flash attention, T={t}, {block_q}×{block_k} tiles", aspect="equal")
    fig.tight_layout()
    return fig


def saved(quick):
    script = load_script("21_flash_attention/saved_bytes.py")
    rows = script.table(script.LENGTHS[:3] if quick else script.LENGTHS)
    text = "\n".join(f"T={t}: dense {d:,} B, flash {f:,} B" for t, d, f in rows)
    return rows, text


def draw_saved(plt, rows):
    t, dense, flash = (np.array(column, dtype=float) for column in zip(*rows))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(t, dense / 2**20, "o-", base=2, label="dense: T×T probabilities (∝ T²)")
    ax.loglog(t, flash / 2**20, "s-", base=2, label="flash: Q, K, V, O, L (∝ T)")
    ax.set(xlabel="sequence length T", ylabel="saved for backward (MiB)",
           title="bytes saved for backward, one head, d=64, float32")
    ax.legend()
    fig.tight_layout()
    return fig


PICTURES = [
    Picture("flash_tiles", "21_flash_attention", tile_grid, draw_tiles),
    Picture("saved_bytes_vs_t", "21_flash_attention", saved, draw_saved),
]
