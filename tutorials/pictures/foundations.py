"""Chapters 1–4: the autograd graph, the training loss, the ring's steps, bandwidth, buckets, ZeRO-1."""
from types import SimpleNamespace

import numpy as np

import minitensor as mt
from minitensor.autograd import topological_order
from minitensor.data import recommended_config

from .draw import COLOURS, Picture, load_script, printed, run


def autograd_graph(quick):
    """Chapter 1's graph of loss = softplus(x @ w + b).sum(), built with the script's own Softplus and
    data; the text is the script's (topological order, backward's visit order, the checks)."""
    script = load_script("01_autograd/function_and_walk.py")
    rng = np.random.default_rng(0)  # the script's data
    x = mt.Tensor(rng.standard_normal((4, 5)))
    w = mt.Tensor(rng.standard_normal((5, 3)), requires_grad=True)
    b = mt.Tensor(rng.standard_normal(3), requires_grad=True)
    loss = script.Softplus.apply(x @ w + b).sum()
    order = topological_order(loss)
    names = {id(x): "x", id(w): "w", id(b): "b"}
    nodes = [(names.get(id(t)) or t._node.name, t.shape, t._node is None,
              [names.get(id(i)) or i._node.name for i in t._node.inputs] if t._node else []) for t in order]
    loss.backward()
    grads = {"w": w.grad.shape, "b": b.grad.shape}
    return dict(nodes=[("x", x.shape, True, [])] + nodes, grads=grads, value=loss.item()), \
        printed(script.main)[1]


def draw_autograd_graph(plt, data):
    nodes, walk = data["nodes"], [n for n, _, _, _ in data["nodes"][1:]]
    column, where, gap = {}, {}, 2.2
    for name, _, leaf, inputs in nodes:  # an op one column right of what it reads; its leaves just left of it
        if not leaf:
            column[name] = 1 + max(column.get(i, 0) for i in inputs)
            where[name] = (gap * column[name], 0)
            for k, i in enumerate(j for j in inputs if j not in column):
                where[i] = (gap * column[name] - 1.2, 0.55 - 1.1 * k)
    fig, ax = plt.subplots(figsize=(7.5, 2.4))
    for name, _, _, inputs in nodes:
        for i in inputs:
            (x0, y0), (x1, y1) = where[i], where[name]
            ax.annotate("", (x1 - 0.4, y1), (x0 + 0.45, y0), arrowprops=dict(
                arrowstyle="-|>", color="#aaaaaa" if i == "x" else "black", lw=0.8))
    for name, shape, leaf, _ in nodes:
        x, y = where[name]
        if leaf:
            grad = data["grads"].get(name)
            text, colour = f"{name} {shape}\n" + (f"grad {grad}" if grad else "no grad wanted"), \
                ("#eeeeee" if grad is None else "#f3d9c4")
        else:
            text, colour = f"{name}\n→ {shape}", "#c6d4e8"
        ax.text(x, y, text, ha="center", va="center", fontsize=7, color="#888888" if name == "x" else "black",
                bbox=dict(boxstyle="round,pad=0.4" if leaf else "square,pad=0.4", fc=colour, ec="#555555"))
        if name in walk:
            ax.text(x + 0.42, y + 0.36, str(len(walk) - walk.index(name)), fontsize=7, color="white", ha="center",
                    va="center", bbox=dict(boxstyle="circle,pad=0.2", fc=COLOURS["backward"], ec="none"))
    ax.set_xlim(0.3, gap * max(column.values()) + 0.8)
    ax.set_ylim(-1.0, 1.1)
    ax.axis("off")
    ax.set_title(f"loss = softplus(x @ w + b).sum() = {data['value']:.4f}: ops (blue) and leaves (orange: a gradient"
                 " is wanted);\nthe orange numbers are the order backward visits them — x (grey) wants none and is "
                 "never visited", fontsize=8)
    fig.tight_layout()
    return fig


def train_loss(quick):
    """Chapter 2's training run (the default recipe; --quick: 40 steps)."""
    recipe = recommended_config()  # the script's defaults
    args = SimpleNamespace(**{k: recipe[k] for k in ("steps", "digits", "n_layer", "n_head", "d_model", "lr",
                                                      "warmup", "weight_decay", "seed")}, batch=recipe["batch_size"])
    if quick:
        args.steps = 40
    return run("02_gpt/train_addition.py", "main", args)


def draw_train_loss(plt, data):
    losses, matched = data
    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.plot(np.arange(len(losses)), losses, lw=0.8, color=COLOURS["forward"])
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="training loss (log)",
           title=f"2-digit addition: held-out exact match {matched:.0%} after {len(losses)} steps")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def ring_steps(quick):
    """Chapter 3's ring on 3 thread ranks: which contributions each chunk holds after each step."""
    return run("03_collectives/ring_allreduce.py", "main", SimpleNamespace(elements=1200), threads=3)


def draw_ring_steps(plt, data):
    states, sent = data
    n, steps = states.shape[0], states.shape[1]
    fig, axes = plt.subplots(1, steps, figsize=(1.6 * steps, 2.0))
    for step, ax in enumerate(axes):
        held = np.vectorize(lambda v: bin(int(v)).count("1"))(states[:, step])  # contributions in each cell
        ax.imshow(held, cmap="Blues", vmin=0, vmax=n + 0.5)
        for r in range(n):
            for c in range(n):
                ranks = [str(k) for k in range(n) if int(states[r, step, c]) >> k & 1]
                ax.text(c, r, "".join(ranks), ha="center", va="center", fontsize=8,
                        color="white" if held[r, c] == n else "black")
            if step:  # the chunk this rank sent to its right neighbour in this step
                ax.add_patch(plt.Rectangle((sent[r, step - 1] - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        phase = "start" if step == 0 else ("reduce-scatter" if step <= n - 1 else "all-gather")
        ax.set_title(phase + ("" if step == 0 else f" {(step - 1) % (n - 1)}"), fontsize=8)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if step == 0 else [], fontsize=7)
    fig.suptitle("ring all-reduce: the ranks whose contribution each chunk holds (red: sent this step)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def bandwidth(quick):
    """Chapter 3's all-reduce timings on 2 thread ranks, 1 KiB to 4 MiB (--quick: 16 KiB)."""
    args = SimpleNamespace(algorithm="builtin", max_kib=16 if quick else 4096)
    return run("03_collectives/bandwidth.py", "main", args, threads=2)


def draw_bandwidth(plt, data):
    sizes, times, n = data["sizes"], data["times"], data["n"]
    model = 2 * (n - 1) * data["alpha"] + 2 * (n - 1) / n * sizes * data["beta"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(sizes, times * 1e6, "o", color=COLOURS["forward"], label="measured (median)")
    ax.loglog(sizes, model * 1e6, "-", color=COLOURS["backward"],
              label=f"α–β fit: α {data['alpha'] * 1e6:.1f} µs, 1/β {1 / data['beta'] / 1e9:.2f} GB/s")
    ax.axvline(n * data["alpha"] / data["beta"], color="grey", ls=":", label="latency = bandwidth term")
    ax.set(xlabel="message size (bytes)", ylabel="all-reduce time (µs)",
           title=f"all-reduce on {n} thread ranks\n(a shared machine: read the shape, not the speed)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def bucket_overlap(quick):
    """Chapter 4's buckets during one backward on 2 thread ranks."""
    return run("04_data_parallel/buckets_overlap.py", "main", SimpleNamespace(bucket_kib=48), threads=2)


def draw_bucket_overlap(plt, data):
    rows = data  # one row per gradient, in the order backward produced them: (name, bucket, states)
    buckets, end = len(rows[0][2]), len(rows) - 0.5
    fig, ax = plt.subplots(figsize=(6, 0.45 * buckets + 1.4))
    for b in range(buckets):
        states = [cells[b] for _, _, cells in rows]
        first = next(i for i, (_, bucket, _) in enumerate(rows) if bucket == b)
        sent = next(i for i, s in enumerate(states) if s in ("SENT", "done"))
        ax.barh(b, sent - first + 1, left=first - 0.5, color="#c6d4e8", label="filling" if b == 0 else None)
        ax.barh(b, end - sent - 0.5, left=sent + 0.5, color=COLOURS["forward"],
                label="all-reduce in flight" if b == 0 else None)
    ax.axvline(end, color="red", lw=2, label="backward ends")
    ax.text(end + 0.3, -0.6, "backward\nends", color="red", fontsize=7, va="top")
    ax.set_xlim(-0.5, end + 4)
    ax.set_yticks(range(buckets), [f"bucket {b}" for b in range(buckets)], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="gradients ready so far (backward order)",
           title="bucket overlap: each bucket's all-reduce starts while backward still runs")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def zero1_memory(quick):
    """Chapter 4's optimizer state per rank, DataParallel + AdamW vs ZeRO-1, on 2 thread ranks."""
    return run("04_data_parallel/zero1_memory.py", "main", SimpleNamespace(steps=1 if quick else 3), threads=2)


def draw_zero1_memory(plt, memory):
    ranks = np.arange(len(memory))
    fig, ax = plt.subplots(figsize=(4.5, 2.6))
    ax.bar(ranks - 0.2, memory[:, 0] / 1e3, 0.4, color=COLOURS["backward"], label="DataParallel + AdamW")
    ax.bar(ranks + 0.2, memory[:, 1] / 1e3, 0.4, color=COLOURS["forward"], label="ZeRO-1")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set(ylabel="optimizer state (kB)", title="AdamW's two moments per rank: ZeRO-1 keeps 1/n of them")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


PICTURES = [
    Picture("autograd_graph", "01_autograd", autograd_graph, draw_autograd_graph),
    Picture("train_loss", "02_gpt", train_loss, draw_train_loss),
    Picture("ring_steps", "03_collectives", ring_steps, draw_ring_steps),
    Picture("bandwidth", "03_collectives", bandwidth, draw_bandwidth),
    Picture("bucket_overlap", "04_data_parallel", bucket_overlap, draw_bucket_overlap),
    Picture("zero1_memory", "04_data_parallel", zero1_memory, draw_zero1_memory),
]
