"""python -m parallel.plan: rank the dp × tp × pp layouts of a model on some devices.

    python -m parallel.plan --config medium --devices 4 --mem-per-device 8GB --batch 32
    python -m parallel.plan --config gpt3-175b --devices 1024 --device a100-80gb --batch 1536
    python -m parallel.plan --n-layer 24 --d-model 1024 --n-head 16 --vocab 50257 --seq 1024 \\
        --devices 16 --device v100-32gb --batch 256 --explain 1
    python -m parallel.plan --config medium --devices 8 --mem-per-device 2GB --batch 8 --max-cp 4 --longest-sequence
    python -m parallel.plan --calibrate
    python -m parallel.plan --n-layer 128 --d-model 25600 --n-head 160 --vocab 51200 --seq 2048 --batch 3072 \\
        --devices 3072 --device a100-80gb --layout tp=8,pp=64,dp=6 --json      (plan.cluster_cli)
    python -m parallel.plan --n-layer 40 --d-model 6144 --n-head 48 --vocab 51200 --seq 2048 --batch 1024 \\
        --devices 256 --device a100-80gb --top 5 --json                        (the 5 best, a JSON list)
    python -m parallel.plan --validate-published
    python -m parallel.plan --config medium --devices 2 --auto-shard
    python -m parallel.plan --config medium --devices 2 --simulate --top 4

Every size flag has a bound (in --help), and the search refuses more than MAX_SEARCH_STEPS
steps: bad input ends with exit 2 and one line, before anything is computed.
"""
import sys
from dataclasses import asdict, replace

from minitensor.flags import AT_LEAST_0, AT_LEAST_1, at_most, bad_flag, parse_checked
from minitensor.models.bert import BertConfig

from . import cluster_cli
from .flags import LIMITS, MAX_MEASURED_BYTES, POSITIVE_INTS, build_parser
from .layout import BF16_MOMENTS, Layout, get_precision
from .memory import memory_per_rank, micro_batch_size
from .model import DEFAULT_BATCH, GPTConfig, dense_param_count, get_config, has_experts
from .moe import active_param_count, expert_fields
from .profiles import load_profile
from .search import longest_sequence, plan

DIMS = {"n_layer": "n_layer", "d_model": "d_model", "n_head": "n_head",
        "vocab": "vocab_size", "seq": "block_size"}

def model_config(args, parser):
    """The model of --config with the dims given, or of the dims alone; parser.error if they do not make one."""
    given = {field: getattr(args, arg) for arg, field in DIMS.items() if getattr(args, arg)}
    if not args.config and len(given) < len(DIMS):
        missing = [f"--{arg.replace('_', '-')}" for arg, f in DIMS.items() if f not in given]
        parser.error(f"give --config or all model dims; missing {' '.join(missing)}")
    try:
        given.update(expert_fields(args, given.get("n_layer") or get_config(args.config).n_layer))
    except ValueError as error:
        parser.error(str(error))
    try:
        config = replace(get_config(args.config), **given) if args.config else GPTConfig(**given)
    except ValueError as error:  # the one left after the flag checks: "d_model=1001 is not divisible by n_head=8"
        parser.error(f"{error}: give --d-model a multiple of --n-head")
    if args.model == "bert":  # the same sizes as an encoder: param_count knows its ends
        config = BertConfig(**{k: v for k, v in asdict(config).items() if k != "causal"})
    return config


def resolve_dtype(name, profile):
    if name != "auto":
        return name
    sixteen_bit = {"bfloat16", "float16"} & set(profile["peak_flops"])
    return "mixed" if sixteen_bit else "float32"


def gib(nbytes):
    return f"{nbytes / 2**30:.3g}"


def format_table(estimates):
    header = ("#", "layout", "m", "flags", "params", "grads", "optim", "activ", "mem GiB",
              "compute", "comm", "bubble", "step s", "reason")
    rows = [header]
    for index, est in enumerate(estimates, 1):
        mem, time = est.memory, est.time
        rows.append((str(index), est.layout.name(), str(est.layout.micro_batches),
                     flags_and_split(est),
                     gib(mem["params"]), gib(mem["grads"]),
                     gib(mem["optim"]), gib(mem["activations"]), gib(mem["total"]),
                     f"{time['compute']:.3g}", f"{time['comm']:.3g}", f"{time['bubble']:.3g}",
                     f"{time['total']:.4g}", est.reason()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in rows)


def flags_and_split(est):
    """The layout's flags, and the blocks per stage when not the even split (--try-splits)."""
    split = [f"split={'-'.join(map(str, est.balance))}"] if est.balance else []
    return ",".join([flag for flag in est.layout.flags().split(",") if flag != "-"] + split) or "-"


def main(argv=None):
    parser = build_parser()
    args = parse_checked(parser, argv, {**dict.fromkeys(POSITIVE_INTS, AT_LEAST_1), "shared_experts": AT_LEAST_0})
    too_large = bad_flag(args, {dest: at_most(high) for dest, high in LIMITS.items()})
    if too_large:
        parser.error(f"{too_large}, the planner's bound")
    if args.max_ranks_per_token and (args.validate_published or args.layout is not None or args.json
                                     or args.longest_sequence):
        parser.error("--max-ranks-per-token is charged by the layout search only (not with --layout, --json, "
                     "--validate-published or --longest-sequence)")
    if args.validate_published or args.layout is not None or args.json:
        return cluster_cli.run(args, parser, model_config)
    if args.calibrate:
        from .calibrate import calibrate
        try:
            calibrate(args.output)
        except ValueError as error:
            parser.error(str(error))
        return 0
    config = model_config(args, parser)
    if args.auto_shard:
        check_measurable(config, [(args.batch or 1, 1)], "--auto-shard", parser)
        return print_auto_shard(config, args.devices, args.batch or 1, args.device)
    if args.batch is None and args.config is None:
        parser.error("--batch is required when the model is given by its dims")
    batch = args.batch or DEFAULT_BATCH[args.config]
    try:
        profile = load_profile(args.device)
    except ValueError as error:
        parser.error(f"--device {args.device}: {error}")
    try:
        dtype = resolve_dtype(args.dtype, profile) + (BF16_MOMENTS if args.moment_dtype == "bfloat16" else "")
        get_precision(dtype)  # a dtype the bfloat16 moments cannot go with: one line, before any search
        if args.longest_sequence:
            return print_longest_sequences(config, args, batch, profile, dtype)
        result = plan(config, args.devices, batch, profile, args.mem_per_device, dtype,
                      args.schedule, args.allow_inter_node_tp, args.max_cp, args.compress, args.local_steps,
                      attention=args.attention, max_ranks=args.max_ranks_per_token, splits=args.try_splits)
    except ValueError as error:
        parser.error(str(error))
    if args.simulate:
        check_measurable(config, [(micro_batch_size(batch, est.layout), est.layout.tp)
                                  for est in result.ranked[:args.top]], "--simulate", parser)
    precision = get_precision(dtype)
    limit = args.mem_per_device or profile["memory_gib"] * 2**30
    active = f" ({active_param_count(config):,} active per token)" if has_experts(config) else ""
    print(f"model {config} = {dense_param_count(config):,} parameters{active}")
    print(f"{args.devices} × {profile['name']} ({gib(limit)} GiB each), global batch {batch}, "
          f"schedule {args.schedule}")
    print(f"dtype {dtype}: {precision.param_bytes} + {precision.grad_bytes} + "
          f"{precision.optim_bytes + precision.master_bytes} bytes per parameter (params + grads + AdamW"
          f"{' with fp32 master' if dtype.split('+')[0] in ('mixed', 'fp16', 'bf16') else ''}), "
          f"activations {precision.activation_bytes} bytes per element")
    print(f"{len(result.ranked)} layouts fit; rejected: " +
          (", ".join(f"{n} {why}" for why, n in result.rejected.items()) or "none"))
    if result.smallest_rejected is not None:
        best = result.smallest_rejected
        parts = ", ".join(f"{k} {gib(best.memory[k])}" for k in
                          ("params", "grads", "optim", "activations"))
        print(f"  (closest miss: {best.layout.name()} m={best.layout.micro_batches}"
              f" {best.layout.flags()} needs {gib(best.memory['total'])} GiB = {parts})")
    if not result.ranked:
        return 1
    print(format_table(result.ranked[:args.top]))
    if args.simulate:
        print_simulated(config, result.ranked[:args.top], batch, profile, dtype)
    if args.explain is not None:
        if not 1 <= args.explain <= len(result.ranked):
            parser.error(f"--explain {args.explain} is not a rank between 1 and "
                         f"{len(result.ranked)}")
        print(f"\nderivation of rank {args.explain}:")
        print("\n".join("  " + line for line in result.ranked[args.explain - 1].lines))
    return 0


def check_measurable(config, micro_batches, flag, parser):
    """parser.error unless one block of `config` on each (micro-batch, tp) fits MAX_MEASURED_BYTES here,
    as the planner counts a one-block model (weights, gradients, AdamW states, activations; float32)."""
    one_block = replace(config, n_layer=1, moe_every=1)  # the largest block: a MoE one if any
    need = max((memory_per_rank(one_block, Layout(tp=tp), b)["total"] for b, tp in micro_batches), default=0)
    if need > MAX_MEASURED_BYTES:
        parser.error(f"{flag} runs one block here and it would need {gib(need)} GiB, over the bound of "
                     f"{gib(MAX_MEASURED_BYTES)} GiB: give a smaller model or --batch")


def print_auto_shard(config, tp, micro_batch, device):
    """The cheapest sharding of one traced block over tp ranks (parallel.plan.auto)."""
    from .auto import Machine, auto_shard, block_graph
    graph = block_graph(config, micro_batch)
    machine = Machine.from_profile(device, tp, "float32")
    plan = auto_shard(graph, machine)
    print(f"one block of {config} on a micro-batch of {micro_batch}, tp={tp} on {device} "
          f"(α {machine.alpha:.3g} s, β {machine.beta:.3g} s/B, {machine.rate:.3g} flop/s)")
    print(plan.table(graph))
    print(plan.summary())
    return 0


def print_simulated(config, estimates, batch, profile, dtype):
    """Closed form vs simulated step time of the top rows, parts measured here, one process."""
    from .memory import micro_batch_size
    from .parts import measure_parts
    from .simulate import simulate_step
    print(f"\nsimulated (schedule replayed, parts measured on this machine, one process, {dtype}):")
    print(f"{'#':<3}{'layout':<16}{'m':>3}{'closed s':>11}{'simulated s':>13}")
    parts = {}
    for index, est in enumerate(estimates, 1):
        layout = est.layout
        b = micro_batch_size(batch, layout)
        if (b, layout.tp) not in parts:
            parts[(b, layout.tp)] = measure_parts(config, b, layout.tp, dtype=dtype)
        simulated = simulate_step(config, layout, batch, parts[(b, layout.tp)], profile, est.balance, dtype).total
        print(f"{index:<3}{layout.name():<16}{layout.micro_batches:>3}{est.time['total']:>11.4g}{simulated:>13.4g}")


def print_longest_sequences(config, args, batch, profile, dtype):
    """The longest sequence that fits without cp and, with --max-cp > 1, with cp up to it."""
    limit = args.mem_per_device or profile["memory_gib"] * 2**30
    found = {max_cp: longest_sequence(config, args.devices, batch, profile, args.mem_per_device, dtype,
                                      args.schedule, args.allow_inter_node_tp, max_cp, attention=args.attention)
             for max_cp in sorted({1, args.max_cp})}  # all found before printing: a ValueError prints nothing
    print(f"longest sequence that fits on {args.devices} × {profile['name']} ({gib(limit)} GiB each), "
          f"global batch {batch}, {dtype}:")
    for max_cp, (seq, est) in found.items():
        where = (f"{est.layout.name()} m={est.layout.micro_batches} {est.layout.flags()}, "
                 f"{gib(est.memory['total'])} GiB, activations {gib(est.memory['activations'])} GiB"
                 if est else "nothing fits")
        print(f"  cp ≤ {max_cp}: {seq} tokens ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
