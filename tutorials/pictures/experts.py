"""Chapter 20's pictures, from its scripts' own functions: tokens per expert with and without
the balancing loss, one step's dispatch all-to-all as a grid of who sends whom how many rows,
each expert's share over the steps, the two domains' experts under each balancing scope, and
the ranks a token reaches with and without the device limit."""
import numpy as np

from minitensor.data import AdditionTask

from .draw import RANKS, Picture, load_script, printed


def loads(quick):
    """Tokens per expert of the first MoE layer over the last 10 steps, α = 0 and α = 0.01."""
    script, task = load_script("20_mixture_of_experts/routing.py"), AdditionTask(digits=2, seed=0)
    steps = 20 if quick else 60
    data = {aux: script.loads(aux, steps, task)[-1] for aux in (0.0, 0.01)}
    text = "\n".join(f"balancing loss α={aux}: tokens per expert {load.tolist()}, max/mean "
                     f"{load.max() / load.mean():.2f}" for aux, load in data.items())
    return data, text


def draw_loads(plt, data):
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for shift, (aux, load) in zip((-0.2, 0.2), data.items()):
        ax.bar(np.arange(len(load)) + shift, load, width=0.4,
               label=f"α = {aux} (max/mean {load.max() / load.mean():.2f})")
    experts = len(next(iter(data.values())))
    ax.set(xlabel="expert", ylabel="tokens (last 10 steps)", title="tokens per expert, with and without balancing",
           xticks=range(experts))  # whole experts only
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)  # below the bars
    fig.tight_layout()
    return fig


def dispatch(quick):
    """grid[r, s]: rows rank r sends rank s in the first MoE layer's dispatch (ep = 4)."""
    script = load_script("20_mixture_of_experts/routing.py")
    grid = script.dispatch_grid(AdditionTask(digits=2, seed=0))
    text = "\n".join("  " + " ".join(f"{n:4d}" for n in row) for row in grid)
    return grid, f"dispatch all-to-all, rows from rank (row) to rank (column):\n{text}"


def draw_dispatch(plt, grid):
    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.imshow(grid, cmap="Blues")
    for (r, s), n in np.ndenumerate(grid):
        ax.text(s, r, str(n), ha="center", va="center", color="white" if n > 0.6 * grid.max() else "black",
                fontweight="bold" if r == s else "normal")
        if r == s:  # the diagonal: rows that stay on their rank, never sent
            ax.add_patch(plt.Rectangle((s - 0.5, r - 0.5), 1, 1, fill=False, ec="#d62728", lw=2))
    ax.set(xlabel="to rank", ylabel="from rank", title="dispatch all-to-all: rows sent",
           xticks=range(len(grid)), yticks=range(len(grid)))
    fig.text(0.5, 0.02, "red squares: rows that stay on their own rank (not sent)", ha="center", fontsize=8,
             color="#d62728")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def balance(quick):
    """Tokens per expert of the first MoE layer, each step, balanced by the auxiliary loss and loss-free."""
    script, task = load_script("20_mixture_of_experts/balance.py"), AdditionTask(digits=2, seed=0)
    steps = 30 if quick else 150
    data = {name: script.train(task, steps, **script.RUNS[name])[0][:, 0] for name in ("aux loss α=0.01",
                                                                                      "loss-free γ=0.01")}
    text = "\n".join(f"{name}: tokens per expert, every {steps // 5} steps: "
                     + " | ".join(" ".join(f"{n:3d}" for n in loads[s]) for s in range(0, steps, steps // 5))
                     for name, loads in data.items())
    return data, text


def draw_balance(plt, data):
    fig, axes = plt.subplots(1, len(data), figsize=(9, 3), sharey=True)
    for ax, (name, loads) in zip(axes, data.items()):
        ax.stackplot(np.arange(1, len(loads) + 1), loads.T / loads.sum(axis=1), labels=[str(e) for e in range(8)])
        ax.set(xlabel="step", title=name, ylim=(0, 1), yticks=np.arange(0, 1.01, 1 / 8))  # balanced: bands 1/8 wide
        ax.grid(axis="y", color="k", lw=0.3)
    axes[0].set_ylabel("share of assignments, layer 0")
    axes[-1].legend(title="expert", fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def fan_out(quick):
    """Tokens reaching 1..4 ranks in one step at ep = 4, top-4 of 16, and the mean rank's all-to-all
    bytes, without and with the device limit M = 3, 2, 1."""
    script, task = load_script("20_mixture_of_experts/fan_out.py"), AdditionTask(digits=2, seed=0)
    data = {}
    for limit in (None, 3, 2, 1):
        reach, per_rank = script.one_step(task, limit)
        data[limit or script.EP] = reach, float(np.mean([counted for counted, _ in per_rank]))
    return data, "\n".join(f"M={m}: tokens reaching 1, 2, 3, 4 ranks {reach.tolist()}, all-to-all {mean:,.0f} bytes"
                           for m, (reach, mean) in data.items())


def draw_fan_out(plt, data):
    fig, (reach_ax, bytes_ax) = plt.subplots(1, 2, figsize=(8, 3))
    width = 0.8 / len(data)
    for i, (limit, (reach, _)) in enumerate(data.items()):
        reach_ax.bar(np.arange(1, len(reach) + 1) + (i - (len(data) - 1) / 2) * width, reach, width=width,
                     label=f"M = {limit}")
    reach_ax.set(xlabel="ranks a token's 4 experts live on", ylabel="tokens (all ranks)", xticks=range(1, 5),
                 title="fan-out, E = 16, top-4, ep = 4")
    reach_ax.legend(fontsize=8)
    bytes_ax.bar([str(m) for m in data], [mean / 1e3 for _, mean in data.values()], color="tab:gray")
    bytes_ax.set(xlabel="M, the most ranks a token may reach", ylabel="kB per rank and step",
                 title="all-to-all bytes: one row per (token, rank)")
    fig.tight_layout()
    return fig


def scope(quick):
    """scope.py's three runs, over the last half of the steps: each MoE layer's share of each
    expert in either domain's assignments, and a sequence's assignments on its most used, second
    most used, ... expert (the mean over sequences, steps and layers)."""
    script = load_script("20_mixture_of_experts/scope.py")
    results, printed_text = printed(script.main, ["--steps", "20"] if quick else [])
    data = {}
    for name, (_, loads) in results.items():
        tail = loads[len(loads) // 2:]  # (steps, layers, sequences, E)
        half = tail.shape[2] // 2
        domains = np.stack([tail[:, :, :half].sum((0, 2)), tail[:, :, half:].sum((0, 2))], axis=1)  # (layers, 2, E)
        data[name] = domains / domains.sum(-1, keepdims=True), -np.sort(-tail, axis=-1).mean((0, 1, 2))
    text = "\n".join(f"{name}, layer {layer}, share of each expert: "
                     + " | ".join(f"domain {'AB'[d]} " + " ".join(f"{x:.2f}" for x in shares[layer, d]) for d in (0, 1))
                     for name, (shares, _) in data.items() for layer in range(len(shares)))
    text += "\n" + "\n".join(f"{name}, one sequence's assignments, its experts sorted by use: "
                              + " ".join(f"{x:.2f}" for x in profile) for name, (_, profile) in data.items())
    return data, printed_text + text


def draw_scope(plt, data):
    layers = len(next(iter(data.values()))[0])
    fig = plt.figure(figsize=(9, 2.2 * layers + 2.6))
    grid = fig.add_gridspec(layers + 1, len(data), height_ratios=[1] * layers + [1.2])
    experts = np.arange(len(next(iter(data.values()))[1]))
    for column, (name, (shares, _)) in enumerate(data.items()):
        for layer in range(layers):
            ax = fig.add_subplot(grid[layer, column])
            for d, shift in enumerate((-0.2, 0.2)):
                ax.bar(experts + shift, shares[layer, d], width=0.4, color=RANKS[d],
                       label=f"domain {'AB'[d]} ({'plain' if d == 0 else 'permuted'} alphabet)")
            ax.hlines(shares[layer].mean(0), experts - 0.4, experts + 0.4, color="k", lw=1.5, label="the batch (both)")
            ax.axhline(1 / len(experts), color="grey", ls="--", lw=0.8, label="even: 1/8")
            apart = 0.5 * np.abs(shares[layer, 0] - shares[layer, 1]).sum()
            ax.text(0.98, 0.95, f"domains apart {apart:.2f}", transform=ax.transAxes, ha="right", va="top", fontsize=7)
            ax.set_ylim(0, 0.4)
            ax.set_xticks(experts)
            ax.tick_params(labelsize=7)
            if layer == 0:
                ax.set_title(name, fontsize=9)
            if column == 0:
                ax.set_ylabel(f"MoE layer {layer}:\nshare of the domain", fontsize=8)
            if layer == layers - 1:
                ax.set_xlabel("expert", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.95))
    ax = fig.add_subplot(grid[layers, :])
    for name, (_, profile) in data.items():
        ax.plot(experts + 1, profile, "o-", lw=1.3, label=name)
    total = round(next(iter(data.values()))[1].sum())
    even = np.full(len(experts), total // len(experts)) + (np.arange(len(experts)) < total % len(experts))
    ax.plot(experts + 1, even, "k:", lw=1, label=f"as even as {total} assignments can be")
    ax.set(xticks=experts + 1)
    ax.set_xlabel("a sequence's experts, from its most used to its least used", fontsize=8)
    ax.set_ylabel(f"of its {total} assignments", fontsize=8)
    ax.set_title("how evenly one sequence spreads over the experts (mean over sequences and both layers)",
                 fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    fig.suptitle("two domains, last half of the steps: batch scope lets them keep to different experts "
                 "(the batch stays even);\nsequence scope evens each sequence, so both domains use every expert",
                 fontsize=9, y=0.99)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


PICTURES = [
    Picture("tokens_per_expert", "20_mixture_of_experts", loads, draw_loads),
    Picture("all_to_all_grid", "20_mixture_of_experts", dispatch, draw_dispatch),
    Picture("load_over_steps", "20_mixture_of_experts", balance, draw_balance),
    Picture("balancing_scope", "20_mixture_of_experts", scope, draw_scope),
    Picture("fan_out", "20_mixture_of_experts", fan_out, draw_fan_out),
]
