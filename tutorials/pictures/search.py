"""Chapters 16–19: the ring's K/V rotation and its work, sparsity against accuracy, the traced block,
the chosen stage cut and the sharded block."""
import copy

import numpy as np

import minitensor as mt
from minitensor import graph as traced
from minitensor.graph.ir import Graph
from parallel.context_parallel import attention_work
from parallel.context_parallel.layout import causal_relation, rank_chunks

from .draw import COLOURS, RANKS, Picture, draw_graph, load_script, printed

RELATION = {"past": COLOURS["forward"], "diagonal": "#8fb0de", "future": "#eeeeee"}


def ring_rotation(quick):
    """Chapter 16: ring.py's `ring_steps` (cp = 4, zigzag) — which K/V block each rank holds at each step
    and which of its chunk pairs it computes — from the layout functions the script calls."""
    script = load_script("16_context_parallel/ring.py")
    cp, lines = 4, []
    script.ring_steps(cp, "zigzag", lines.append)
    cells = {(rank, step): ((rank - step) % cp, [[causal_relation(q, k) for k in rank_chunks((rank - step) % cp, cp,
                                                                                             "zigzag")]
                                                 for q in rank_chunks(rank, cp, "zigzag")])
             for rank in range(cp) for step in range(cp)}
    return (cp, cells, [rank_chunks(r, cp, "zigzag") for r in range(cp)]), "\n".join(lines)


def draw_ring_rotation(plt, data):
    cp, cells, chunks = data
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for (rank, step), (source, pairs) in cells.items():
        x0, y0 = step * 3, rank * 3
        ax.add_patch(plt.Rectangle((x0 - 0.1, y0 - 0.1), 2.2, 2.2, fc=RANKS[source], alpha=0.35, ec="none"))
        for (i, j), relation in np.ndenumerate(np.array(pairs, dtype=object)):
            ax.add_patch(plt.Rectangle((x0 + j, y0 + i), 0.95, 0.95, fc=RELATION[relation], ec="white"))
        ax.text(x0 + 1, y0 + 2.45, f"K/V of rank {source}", ha="center", va="center", fontsize=6)
        if step < cp - 1:
            ax.annotate("", (x0 + 2.9, ((rank + 1) % cp) * 3 + 1), (x0 + 2.1, y0 + 1),
                        arrowprops=dict(arrowstyle="->", color="#999999", lw=0.5))
    ax.set_xticks([s * 3 + 1 for s in range(cp)], [f"step {s}" for s in range(cp)], fontsize=7)
    ax.set_yticks([r * 3 + 1 for r in range(cp)], [f"rank {r}\nq chunks {chunks[r]}" for r in range(cp)], fontsize=6)
    ax.set_xlim(-0.4, 3 * cp - 0.6)
    ax.set_ylim(3 * cp - 0.2, -0.4)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#999999") for c in RELATION.values()]
    fig.legend(handles, ["past: computed", "diagonal: computed, causal mask", "future: skipped"], fontsize=7,
               ncol=3, loc="lower center")
    fig.suptitle(f"ring attention, cp = {cp}, zigzag: each step every rank computes its q chunks (rows) against the "
                 "K/V it holds\n(columns: that rank's 2 chunks), then passes the K/V on to rank + 1 (grey arrows)",
                 fontsize=7)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def cp_work(quick):
    """Chapter 16: work_table.py's work per rank (layout.attention_work, sequence 2·cp·256), cp = 4 and 8."""
    script = load_script("16_context_parallel/work_table.py")
    work = {(cp, layout): [attention_work(2 * cp * script.CHUNK, r, cp, layout) for r in range(cp)]
            for cp in (4, 8) for layout in ("contiguous", "zigzag")}
    text = "".join(printed(script.table, cp)[1] for cp in (4, 8))
    return work, text


def draw_cp_work(plt, work):
    fig, axes = plt.subplots(1, 2, figsize=(7, 2.8), gridspec_kw={"width_ratios": [4, 8]}, sharey=False)
    for ax, cp in zip(axes, (4, 8)):
        for k, (layout, colour) in enumerate((("contiguous", COLOURS["backward"]), ("zigzag", COLOURS["forward"]))):
            values = np.array(work[cp, layout]) / 1e3
            ax.bar(np.arange(cp) + (k - 0.5) * 0.4, values, 0.4, color=colour,
                   label=f"{layout}: busiest / mean {values.max() / values.mean():.2f}")
        ax.set_xticks(range(cp), [f"r{r}" for r in range(cp)], fontsize=7)
        ax.tick_params(labelsize=7)
        ax.set_title(f"cp = {cp} ((2·cp−1)/cp = {(2 * cp - 1) / cp:.2f})", fontsize=8)
        ax.legend(fontsize=6, loc="upper left", framealpha=0.9)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    axes[0].set_ylabel("(query, key) pairs (thousands)", fontsize=7)
    fig.suptitle("causal attention work per rank: the contiguous split leaves the first ranks idle,\n"
                 "zigzag gives every rank the same", fontsize=8)
    fig.tight_layout()
    return fig


def sparsity(quick):
    """Chapter 17: held-out exact match of the cached 2000-step teacher (parallel.smaller_models, what
    prune_curve.py runs) with a share of its block weights zeroed by magnitude (global), before any
    fine-tuning, and with half its heads and neurons removed; --quick: a 40-step teacher, 50 problems."""
    from minitensor.data import exact_match
    from minitensor.prune import MagnitudePruner, prune_heads, prune_neurons, units_to_prune
    from parallel import smaller_models

    teacher = smaller_models.trained_teacher(40 if quick else 2000)
    problems, task = 50 if quick else 1000, smaller_models.task()
    curve = []
    for share in (0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95):
        model = copy.deepcopy(teacher)
        reached = MagnitudePruner(model, share, scope="global").sparsity() if share else 0.0
        curve.append((reached, exact_match(model, task, problems)))
    model = copy.deepcopy(teacher)
    prune_heads(model, units_to_prune(model, "heads", model.config.n_head // 2, 2))
    prune_neurons(model, units_to_prune(model, "neurons", model.config.mlp_width // 2, 2))
    structured = exact_match(model, task, problems)
    text = "\n".join(f"  magnitude {s:.2f}: exact match {m:.3f}" for s, m in curve) + \
        f"\n  structured 1/2 heads + neurons: exact match {structured:.3f}"
    return (curve, structured, problems), text


def draw_sparsity(plt, data):
    curve, structured, problems = data
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    shares, matched = zip(*curve)
    ax.plot(shares, matched, "o-", color=COLOURS["forward"], label="magnitude pruning (global), not fine-tuned")
    ax.plot([0.5], [structured], "s", color=COLOURS["backward_input"], ms=8,
            label="1/2 heads + neurons removed (structured)")
    ax.set(xlabel="share of the blocks' weights zeroed", ylabel=f"held-out exact match ({problems} problems)",
           ylim=(-0.03, 1.03))
    ax.xaxis.label.set_fontsize(8)
    ax.yaxis.label.set_fontsize(8)
    ax.tick_params(labelsize=7)
    ax.set_title("the addition GPT pruned without fine-tuning: half the weights go for free,\n"
                 "then the answers collapse (fine-tuning brings them back: the README's table)", fontsize=8)
    fig.legend(fontsize=7, ncol=2, loc="lower center")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def block_subgraph(g, prefix="blocks.0."):
    """Block 0 of a traced GPT as a graph of its own: its ops and parameters, the value it reads as input."""
    names = [n.name for n in g.nodes]
    first = min(k for k, n in enumerate(g.nodes) if n.name.startswith(prefix))
    last = max(k for k, n in enumerate(g.nodes) if n.name.startswith(prefix))
    end = next(k for k in range(last + 1, len(names)) if g.nodes[k].op == "Add")  # the block's second residual
    inside = g.nodes[first:end + 1]
    outside = sorted({i for n in inside for i in n.inputs} - {n.name for n in inside}, key=names.index)
    return Graph([g.node(o).evolve(op="input", inputs=()) for o in outside] + inside, (g.nodes[end].name,))


def traced_block(quick):
    """Chapter 18: trace_and_draw.py's traced GPT (minitensor.graph.trace, the script's config and data),
    block 0 cut out of it; the text is the script's run (the table of block 0's rows)."""
    script = load_script("18_operator_graphs/trace_and_draw.py")
    mt.manual_seed(0)
    config = script.GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16)
    model = script.GPT(config, dtype=mt.float64)
    rng = np.random.default_rng(0)
    idx, targets = (rng.integers(0, config.vocab_size, (4, 16)) for _ in range(2))
    return block_subgraph(traced.trace(model.forward, idx, targets).graph), printed(script.main, [])[1]


def draw_traced_block(plt, g):
    fig, ax = plt.subplots(figsize=(6.5, 7.5))
    draw_graph(ax, g, label=lambda n: n.name if n.op == "input" else f"{n.op} {n.shape}\n{n.flops:,} FLOPs",
               params=lambda n, names: (names[0].rsplit(".", 1)[0].removeprefix("blocks.0."), "#f3d9c4"))
    ax.set_title(f"block 0 of chapter 18's traced GPT: {sum(n.op not in ('input', 'param') for n in g.nodes)} ops "
                 "(boxes: op, output shape,\nforward FLOPs), its parameters (orange), the residual stream in "
                 "(add_0) and out;\ndrawn from the graph's data with matplotlib, no Graphviz", fontsize=8)
    fig.tight_layout()
    return fig


LAYOUT_COLOURS = {"R": "#eeeeee", "S(0)": COLOURS["forward"], "S(1)": COLOURS["backward"], "S(2)": "#8fb0de",
                  "P": COLOURS["backward_input"]}


def sharded_block(quick):
    """Chapter 19: rediscover_megatron.py's search (parallel.plan.auto.auto_shard on one traced block of
    the medium config, micro-batch 8, tp = 2, laptop profile): every value's layout and the collectives."""
    from parallel.plan import get_config
    from parallel.plan.auto import Machine, auto_shard, block_graph

    g = block_graph(get_config("medium"), 8)
    plan = auto_shard(g, Machine.from_profile("laptop-cpu", 2, "float32"))
    return (g, plan.layouts, [(c.value, c.direction, c.source, c.target) for c in plan.collectives]), \
        plan.table(g) + "\n" + plan.summary()


def draw_sharded_block(plt, data):
    g, layouts, collectives = data
    fig, ax = plt.subplots(figsize=(8, 10))
    where = draw_graph(ax, g, colour=lambda n: LAYOUT_COLOURS.get(layouts[n.name], "white"),
                       label=lambda n: f"{n.op if n.op != 'input' else 'x'} {layouts[n.name]}",
                       params=lambda n, names: (names[0].rsplit(".", 1)[0] + " W " + layouts[names[0]],
                                                LAYOUT_COLOURS.get(layouts[names[0]], "white")),
                       spacing=4.2, fontsize=8)
    left = min(x for x, _ in where.values())
    for value, direction, source, target in collectives:  # in a margin left of the graph, at the value's row
        _, y = where[value]
        ax.text(left - 1.2, y, f"{direction}: {source} → {target}", fontsize=8, color="red", ha="right", va="center")
    ax.set_xlim(left - 4.6, ax.get_xlim()[1])
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#999999") for c in LAYOUT_COLOURS.values()]
    ax.legend(handles, ["R replicated", "S(0) split on dim 0", "S(1) split on dim 1", "S(2) split on dim 2",
                        "P partial sums"], fontsize=8, loc="lower right")
    ax.set_title("the search's layout of one block over tp = 2: q, k, v and fc column-parallel (weight S(0)),\n"
                 "both projections row-parallel (weight S(1)): Megatron's split; red: where a collective\n"
                 "turns partial sums (P) into whole ones (R)", fontsize=9)
    fig.tight_layout()
    return fig


def stage_cut(quick):
    """Chapter 19: stage_boundaries.py's parts (parallel.plan.parts.measure_parts: medians of repeats),
    its two balances for pp = 3 (by measured time, by parameter count) and each stage's seconds."""
    script = load_script("19_finding_the_strategy/stage_boundaries.py")
    from parallel.pipeline.partition import balance_by_cost, balance_by_parameters
    from parallel.plan.parts import measure_parts
    from parallel.plan.validate_worker import dense_gpt

    parts = measure_parts(script.CONFIG, 4, 1)
    block, first, last = sum(parts.block), sum(parts.embed), sum(parts.head)
    balances = {"by measured time (the DP)": balance_by_cost([block] * script.CONFIG.n_layer, 3, first, last),
                "by parameter count": balance_by_parameters(dense_gpt(script.CONFIG), 3)}
    text = "\n".join(f"{name}: {b}, stage seconds {[f'{s * 1e3:.3g} ms' for s in script.stage_seconds(b, block, first, last)]}"
                     for name, b in balances.items())
    return (balances, block, first, last), text


def draw_stage_cut(plt, data):
    balances, block, first, last = data
    fig, axes = plt.subplots(1, 2, figsize=(7, 2.8), sharey=True)
    for ax, (name, balance) in zip(axes, balances.items()):
        for s, count in enumerate(balance):
            parts = [("embedding", first if s == 0 else 0, "#8c8c8c")] + \
                [("block", block, COLOURS["forward"])] * count + \
                [("head + loss", last if s == len(balance) - 1 else 0, COLOURS["backward"])]
            bottom = 0
            for what, seconds, colour in parts:
                if seconds:
                    ax.bar(s, seconds * 1e3, 0.7, bottom=bottom, color=colour, ec="white", lw=0.5)
                    bottom += seconds * 1e3
            ax.text(s, bottom, f"{count} block{'s' * (count != 1)}", ha="center", va="bottom", fontsize=7)
        slowest = max(sum([first * (s == 0), count * block, last * (s == len(balance) - 1)])
                      for s, count in enumerate(balance))
        ax.axhline(slowest * 1e3, color="red", ls="--", lw=1)
        ax.set_title(f"{name}: {balance}\nslowest stage {slowest * 1e3:.3g} ms (red)", fontsize=8)
        ax.set_xticks(range(len(balance)), [f"stage {s}" for s in range(len(balance))], fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("forward + backward of a micro-batch (ms)", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#8c8c8c", COLOURS["forward"], COLOURS["backward"])]
    fig.legend(handles, ["embedding", "one block", "head + loss (4096 words)"], fontsize=7, ncol=3, loc="lower center")
    fig.suptitle("where to cut 8 blocks into 3 stages (measured on this machine: medians)", fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


PICTURES = [
    Picture("ring_rotation", "16_context_parallel", ring_rotation, draw_ring_rotation),
    Picture("cp_work", "16_context_parallel", cp_work, draw_cp_work),
    Picture("sparsity", "17_smaller_models", sparsity, draw_sparsity),
    Picture("traced_block", "18_operator_graphs", traced_block, draw_traced_block),
    Picture("stage_cut", "19_finding_the_strategy", stage_cut, draw_stage_cut),
    Picture("sharded_block", "19_finding_the_strategy", sharded_block, draw_sharded_block),
]
