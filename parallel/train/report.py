"""What rank 0 prints: the start-up summary, progress lines, communication per step, and
the Chrome trace of every rank. Functions that take `group` are collectives."""
import os

import numpy as np

from ..comm.gather import all_gather_json
from ..launch import launch_report
from ..pipeline.timeline import Timeline, all_gather_events
from ..plan.model import dense_param_count

RESTARTED = "PARALLEL_TRAIN_ONE_BLAS_THREAD"  # set by __main__ when it restarted with one BLAS thread

GROUPS = ("dp", "tp", "pp", "cp", "dp_cp", "embedding", "ep", "edp")  # cp, dp_cp: context parallelism; embedding: a
# BERT's tied copies; ep, edp: the experts' all-to-alls and their gradients' replicas
COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "all_to_all")
COUNTS = ("calls", "elements", "bytes")
LINK_SECONDS = ("modelled_s", "measured_s", "exposed_s")  # a LinkGroup's figures (parallel.comm.link)


def clock(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}:{seconds:02d}"


def blas_report(group):
    """parallel.launch's line, unless parallel.train restarted itself with one BLAS thread."""
    if not os.environ.get(RESTARTED):
        return launch_report(group)
    return (f"parallel: {group.size} rank(s) on the {group.backend} backend; BLAS threads: 1 per process "
            f"(parallel.train restarted itself with OPENBLAS_NUM_THREADS=1; set it to choose)")


def fp8_recipe_text(recipe):
    """An FP8 recipe's settings in a few words."""
    if recipe.scaling == "blockwise":
        return f"e4m3, 1x{recipe.tile} tiles and {recipe.tile}x{recipe.tile} weight blocks"
    return (f"e4m3 forward, e5m2 gradients, delayed: {recipe.history} steps of amax history, "
            f"{recipe.amax_compute}, margin {recipe.margin}")


def startup_summary(args, model, group):
    """Layout, rank grid, parameters per rank, BLAS threads (collective: gathers the counts)."""
    counts = group.all_gather(np.array([model.num_parameters()], dtype=np.int64))
    if group.rank != 0:
        return None
    config, mesh = model.config, model.mesh
    switches = [name for name, on in (("sequence parallel", args.sequence_parallel),
                                      ("activation recomputation", args.recompute_activations),
                                      (f"ZeRO-{args.zero}", args.zero), (f"link {args.link}", args.link),
                                      (f"compression {args.compress}", args.compress != "none"),
                                      (f"local SGD every {args.local_steps} steps", args.local_steps),
                                      (f"{args.experts} experts (top-{args.top_k}) over ep={args.ep}",
                                       getattr(args, "experts", 0)),
                                      (f"flash attention in {args.attention_block}×{args.attention_block} tiles",
                                       getattr(args, "attention", "dense") == "flash")) if on]
    task = (f"char-level text {args.data}" if args.data else f"addition of {args.digits}-digit numbers"
            + (", masked digits (MLM)" if args.model == "bert" else ""))
    lines = [
        blas_report(group) + (f" (--threads {args.threads})" if args.threads else ""),
        f"task: {task}; {config.name} n_layer={config.n_layer} n_head={config.n_head} d_model={config.d_model} "
        f"block_size={config.block_size} vocab={config.vocab_size}, {args.dtype}"
        + (f", precision {args.precision}: compute {model.amp.policy.compute_dtype}, float32 masters"
           + (", loss scaling" if model.amp.scaler.enabled else "") if model.amp.mixed else "")
        + (f", precision {args.precision}: the blocks' linears on FP8 operands ({fp8_recipe_text(model.amp.policy.fp8)}),"
           f" the rest {args.dtype}" if model.amp.fp8 is not None else ""),
        f"layout: dp={mesh.dp} tp={mesh.tp} pp={mesh.pp}"
        + context_parallel_text(args, mesh) + f", schedule {args.schedule} with "
        f"{args.microbatches} micro-batch(es)" + (f" and {args.chunks} chunks per rank" if args.chunks > 1 else "")
        + (", " + ", ".join(switches) if switches else ""),
        f"global batch {args.batch}" + (f" x {args.accumulate} accumulated" if args.accumulate > 1 else "")
        + f", {args.steps} steps, peak lr {args.lr:g}, seed {args.seed}",
        mesh.describe().rsplit("\n", 1)[0],  # the grid, without rank 0's "this is rank 0" line
        "parameters per rank: " + ", ".join(f"{r}: {int(n):,}" for r, n in enumerate(counts))
        + f"  (single device: {dense_param_count(config):,})",
    ]
    return "\n".join(lines)


def context_parallel_text(args, mesh):
    """' cp=2 (zigzag, ring attention)' for the layout line; '' without context parallelism."""
    if mesh.cp == 1:
        return ""
    attention = "Ulysses all-to-all" if args.cp_comm_type == "a2a" else "ring attention"
    return f" cp={mesh.cp} ({args.cp_layout}, {attention})"


def progress_line(step, steps, loss, tokens, elapsed, done):
    eta = elapsed / done * (steps - step) if done else 0.0
    return (f"step {step:>{len(str(steps))}}/{steps}  loss {loss:.4f}  {tokens / elapsed:,.0f} tokens/s  "
            f"elapsed {clock(elapsed)}  eta {clock(eta)}")


def step_state_text(model, group):
    """MaxVio = (max − mean)/mean of each MoE layer's tokens per expert in the last step (its loss-free
    balancing state, on whichever pp stage holds it), every rank's gathered (a collective)."""
    states = {}
    for part in all_gather_json(group, {name: update.max_violation for name, update in model.step_updates}):
        states.update(part)
    return "  MaxVio " + " ".join(f"{name.removesuffix('.mlp')} {value:.3f}"
                                  for name, value in sorted(states.items(), key=lambda kv: layer_number(kv[0])))


def layer_number(name):
    return int(name.split(".")[1])


def merge_stats(*stats):
    """Sum {(group, kind): counts} dicts (and the link's seconds, where there are some)."""
    total = {}
    for s in stats:
        for key, counts in s.items():
            into = total.setdefault(key, dict.fromkeys(COUNTS, 0))
            for c, value in counts.items():
                into[c] = into.get(c, 0) + value
    return total


def link_lines(stats, link, step_seconds):
    """Rank 0's modelled, measured and exposed communication seconds of one step, per group and
    kind, on the simulated `link`; exposed = time blocked waiting, not hidden by compute."""
    rows = [(key, counts) for key, counts in sorted(stats.items()) if "modelled_s" in counts]
    lines = [f"link {link.name} (α = {link.alpha * 1e6:g} µs, β = {link.beta * 1e9:g} ns/B), rank 0, last step:"]
    for (g, kind), counts in rows:
        lines.append(f"  {g} {kind:<14} modelled {counts['modelled_s']:.4f} s  measured {counts['measured_s']:.4f} s"
                     f"  exposed {counts['exposed_s']:.4f} s")
    exposed = sum(counts["exposed_s"] for _, counts in rows)
    modelled = sum(counts["modelled_s"] for _, counts in rows)
    lines.append(f"exposed communication: {exposed:.4f} s of the step's {step_seconds:.4f} s "
                 f"(modelled communication {modelled:.4f} s)")
    return lines


def communication_table(stats, group):
    """This rank's and all ranks' communication of one step, by group and kind (collective)."""
    keys = [(g, k) for g in GROUPS for k in COMM_KINDS]
    mine = np.array([[stats.get(key, {}).get(c, 0) for c in COUNTS] for key in keys], dtype=np.int64)
    everyone = group.all_reduce(mine.copy())
    if group.rank != 0:
        return None
    lines = [f"communication per step (counted by the groups: rank 0 | sum over all {group.size} ranks):"]
    for (g, kind), (calls, _, nbytes), (_, _, all_bytes) in zip(keys, mine, everyone):
        if calls or all_bytes:
            lines.append(f"  {g} {kind:<14} {calls:>5} calls {nbytes / 1e6:>10.3f} MB | {all_bytes / 1e6:>10.3f} MB")
    for kind in COMM_KINDS:
        rows = [i for i, key in enumerate(keys) if key[1] == kind]
        if everyone[rows, 2].sum():
            lines.append(f"  total {kind:<14} {mine[rows, 0].sum():>3} calls {mine[rows, 2].sum() / 1e6:>10.3f} MB"
                         f" | {everyone[rows, 2].sum() / 1e6:>10.3f} MB")
    if len(lines) == 1:
        lines.append("  none (one rank)")
    return "\n".join(lines)


def save_trace(model, group, path):
    """Chrome trace of the last step's pipeline actions of EVERY rank, one process per world
    rank (collective over `group`, the world). Each pp group has its own time origin."""
    events = all_gather_events(group, model.events(), rank=group.rank)
    if group.rank == 0:
        Timeline(events, num_ranks=group.size).save_chrome_trace(path)
