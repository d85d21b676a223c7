"""Chapters 5, 6, 9, 10: who holds which weights (tensor parallelism, heads), the mesh, parity, the planner."""
import numpy as np

import minitensor as mt
import parallel
from minitensor import nn
from parallel import ColumnParallelLinear, ParallelSelfAttention, RowParallelLinear
from parallel.mesh import rank_of

from .draw import COLOURS, RANKS, Picture, load_script, printed, run


def owner_grid(ax, plt, owners, title, names=None):
    """A weight matrix (rows = out features, columns = in features) coloured by the rank holding each entry."""
    from matplotlib.colors import ListedColormap

    n = int(owners.max()) + 1
    ax.imshow(owners, cmap=ListedColormap(RANKS[:n]), vmin=-0.5, vmax=n - 0.5, aspect="equal")
    for (r, c), rank in np.ndenumerate(owners):
        ax.text(c, r, names[r][c] if names else str(rank), ha="center", va="center", fontsize=6, color="white")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=7)


def column_row(quick):
    """Chapter 5: the owner of every entry of fc.weight and proj.weight on 2 thread ranks (the script's
    `ownership`, on the script's layers); the text is the script's run."""
    script = load_script("05_tensor_parallel/column_row_mlp.py")

    def owners():
        group = parallel.world()
        mt.manual_seed(0)
        fc = ColumnParallelLinear(nn.Linear(script.D_MODEL, script.HIDDEN).double(), group)
        proj = RowParallelLinear(nn.Linear(script.HIDDEN, script.D_MODEL).double(), group)
        return script.ownership(fc.weight, group), script.ownership(proj.weight, group)
    return printed(owners, threads=2)[0], printed(script.main, threads=2)[1]


def draw_column_row(plt, data):
    fc, proj = data
    fig, axes = plt.subplots(1, 3, figsize=(7, 2.6), gridspec_kw={"width_ratios": [fc.shape[1], 5, proj.shape[1]]})
    owner_grid(axes[0], plt, fc, f"fc.weight {fc.shape}:\ncolumn-parallel, rows split")
    owner_grid(axes[2], plt, proj, f"proj.weight {proj.shape}:\nrow-parallel, columns split")
    axes[1].axis("off")
    axes[1].text(0.5, 0.5, "x (whole, every rank)\n↓\nrank r: x · fc_rᵀ → its hidden\nslice; gelu on its own\n↓\n"
                 "partial y_r = h_r · proj_rᵀ\n↓\nall-reduce: y = Σ_r y_r\n(the one collective)",
                 ha="center", va="center", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=RANKS[r]) for r in range(int(fc.max()) + 1)]
    fig.legend(handles, [f"rank {r}" for r in range(len(handles))], fontsize=7, ncol=len(handles), loc="lower center")
    fig.suptitle("Megatron's MLP on 2 ranks: each cell is a weight entry, coloured by the rank holding it", fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def heads(quick):
    """Chapter 6: which rank holds every row of q/k/v and column of proj (the script's all-gather on
    ParallelSelfAttention, 2 thread ranks); the text is the script's run."""
    script = load_script("06_attention_vocab_sp/attention_heads.py")

    def owners():
        group = parallel.world()
        mt.manual_seed(0)
        attn = ParallelSelfAttention(script.SelfAttention(script.CONFIG).double(), group)
        row = group.all_gather(np.full(attn.q.weight.shape[0], group.rank, dtype=np.int64))
        column = group.all_gather(np.full(attn.proj.weight.shape[1], group.rank, dtype=np.int64))
        return row, column, attn.local_heads
    (row, column, local), text = printed(owners, threads=2)[0], printed(script.main, threads=2)[1]
    return dict(row=row, column=column, local=local, n_head=script.CONFIG.n_head, d_model=script.CONFIG.d_model), text


def draw_heads(plt, data):
    d, head_dim = data["d_model"], data["d_model"] // data["n_head"]
    qkv = np.repeat(data["row"][:, None], d, axis=1)
    proj = np.repeat(data["column"][None, :], d, axis=0)
    fig, axes = plt.subplots(1, 4, figsize=(7.5, 2.5))
    for ax, name in zip(axes[:3], "qkv"):
        labels = [[f"h{r // head_dim}"] * d for r in range(d)]
        owner_grid(ax, plt, qkv, f"{name}.weight: rows\n= heads' outputs", labels)
    owner_grid(axes[3], plt, proj, "proj.weight: columns\n= heads' inputs",
               [[f"h{c // head_dim}" for c in range(d)] for _ in range(d)])
    handles = [plt.Rectangle((0, 0), 1, 1, color=RANKS[r]) for r in range(int(data["row"].max()) + 1)]
    fig.legend(handles, [f"rank {r}: heads {r * data['local']}–{(r + 1) * data['local'] - 1}" for r in
                         range(len(handles))], fontsize=7, ncol=len(handles), loc="lower center")
    fig.suptitle(f"attention over 2 ranks: {data['n_head']} heads of {head_dim}, each rank holds whole heads\n"
                 f"(hN: the head of that row or column); one all-reduce after proj", fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def mesh_grid(quick):
    """Chapter 9's 2 x 2 x 2 mesh: rank numbers from parallel.mesh.rank_of, text from Mesh.describe()."""
    dp, tp, pp = 2, 2, 2
    text = run("09_3d/mesh_grid.py", "main", dp, tp, pp, 4, threads=dp * tp * pp)[1]
    return (dp, tp, pp), text


def draw_mesh_grid(plt, shape):
    dp, tp, pp = shape
    fig, axes = plt.subplots(1, pp, figsize=(2.6 * pp, 2.8))
    for stage, ax in enumerate(np.atleast_1d(axes)):
        for d in range(dp):
            ax.add_patch(plt.Rectangle((-0.45, d - 0.4), tp - 0.1, 0.8, color="#c6d4e8"))  # a tp group
            for t in range(tp):
                ax.text(t, d, str(rank_of(d, t, stage, dp, tp)), ha="center", va="center", fontsize=14)
        for t in range(tp):  # a dp group: the same tp column in every dp row
            for d in range(dp - 1):
                ax.plot([t, t], [d + 0.25, d + 0.75], color=COLOURS["backward"], lw=3)
        ax.set_xlim(-0.6, tp - 0.4)
        ax.set_ylim(dp - 0.4, -0.6)
        ax.set_xticks(range(tp), [f"tp{t}" for t in range(tp)])
        ax.set_yticks(range(dp), [f"dp{d}" for d in range(dp)])
        ax.set_title(f"pp stage {stage}", fontsize=9)
    fig.suptitle(f"mesh dp={dp} x tp={tp} x pp={pp}\nblue row: a tp group (adjacent ranks); orange: a dp group;\n"
                 f"a pp group: the same cell in every stage", fontsize=8)
    fig.tight_layout()
    return fig


def loss_parity(quick):
    """Chapter 9: one device and six 8-rank layouts, loss per step (--quick: two layouts, 2 steps)."""
    module = load_script("09_3d/check_layouts.py")
    layouts = module.parse_layouts("2,2,2 1,2,4" if quick else module.LAYOUTS)
    return run("09_3d/check_layouts.py", "main", layouts, 2 if quick else 8, False, False, threads=8)


def draw_loss_parity(plt, curves):
    reference = np.array(curves["one device"])
    steps = np.arange(1, len(reference) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 2.9))
    left.plot(steps, reference, color="black", lw=3, alpha=0.3, label="one device")
    markers = "os^vDx"
    for (name, losses), marker in zip(((n, c) for n, c in curves.items() if n != "one device"), markers):
        left.plot(steps, losses, marker, ms=4, fillstyle="none", label=name)
        relative = np.abs(np.array(losses) - reference) / np.abs(reference)
        right.semilogy(steps, np.maximum(relative, 1e-17), marker, ms=4, fillstyle="none", label=name)
    right.axhline(1e-9, color="red", ls="--", lw=1, label="tolerance 1e-9")
    left.set(xlabel="step", ylabel="loss", title="the loss of every layout on one device's curve")
    right.set(xlabel="step", ylabel="|loss − one device| / loss", title="their differences (0 drawn at 1e-17)")
    for ax in (left, right):
        ax.title.set_fontsize(8)
        ax.set_xticks(steps)
    left.legend(fontsize=6)
    fig.tight_layout()
    return fig


def planner_vs_measured(quick):
    """Chapter 10: the planner's bytes against the real model's, on 2 thread ranks."""
    return run("10_planner/check_memory.py", "main", threads=2)


def draw_planner_vs_measured(plt, predictions):
    fig, ax = plt.subplots(figsize=(4.4, 3.6))
    # large hollow markers under small filled ones: points that coincide stay visible
    for (label, pairs), (marker, size) in zip(predictions.items(), [("o", 13), ("s", 6), ("^", 8)]):
        filled = size < 10
        ax.loglog(pairs[:, 0], pairs[:, 1], marker, ms=size, fillstyle="full" if filled else "none",
                  mew=1.5, label=label, zorder=3 if filled else 2)
    values = np.concatenate([pairs for pairs in predictions.values()]).astype(float)
    line = np.array([values.min() / 2, values.max() * 2])
    ax.loglog(line, line, color="grey", lw=1, ls=":", label="measured = predicted")
    ax.set(xlabel="planner's prediction (bytes)", ylabel="real model (bytes)",
           title="parameters on the line (both layouts' points coincide);\nactivations above or below it")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    return fig


PICTURES = [
    Picture("column_row", "05_tensor_parallel", column_row, draw_column_row),
    Picture("heads_over_ranks", "06_attention_vocab_sp", heads, draw_heads),
    Picture("mesh_grid", "09_3d", mesh_grid, draw_mesh_grid),
    Picture("loss_parity", "09_3d", loss_parity, draw_loss_parity),
    Picture("planner_vs_measured", "10_planner", planner_vs_measured, draw_planner_vs_measured),
]
