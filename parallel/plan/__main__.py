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
import argparse
import math
import re
import sys
from dataclasses import asdict, replace

from minitensor.flags import AT_LEAST_1, DashValueParser, at_most, bad_flag, parse_checked
from minitensor.models.bert import BertConfig

from . import cluster_cli
from .layout import PRECISIONS, SCHEDULES, Layout, get_precision
from .memory import memory_per_rank, micro_batch_size
from .model import CONFIGS, DEFAULT_BATCH, GPTConfig, dense_param_count, get_config, has_experts
from .moe import active_param_count
from .profiles import load_profile, packaged_profiles
from .search import MAX_SEARCH_STEPS, longest_sequence, plan

UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
DIMS = {"n_layer": "n_layer", "d_model": "d_model", "n_head": "n_head",
        "vocab": "vocab_size", "seq": "block_size"}
# Far above today's largest runs (GPT-3: 96 layers, d_model 12288, 1024 GPUs), low enough that the
# search and its arithmetic stay finite and quick.
LIMITS = {"n_layer": 100_000, "d_model": 1_000_000, "n_head": 1_000_000, "vocab": 10_000_000, "seq": 2**24,
          "batch": 2**24, "devices": 1_000_000}
MAX_MEASURED_BYTES = 2**31  # --auto-shard and --simulate run one block on this machine: at most 2 GiB


def parse_size(text):
    """'8GB' -> 8e9 bytes, '8GiB' -> 8·2³⁰ bytes, '512MiB', '1e9'."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"memory size {text!r} must be positive (try 8GB or 8GiB)")
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?I?B?)\s*", text.upper())
    if not match or match.group(2) not in UNITS:
        raise argparse.ArgumentTypeError(f"cannot read memory size {text!r} (try 8GB or 8GiB)")
    size = float(match.group(1)) * UNITS[match.group(2)]  # '1e' raises ValueError: argparse's "invalid" line
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"memory size {text!r} is not a finite number of bytes (try 8GB)")
    return int(size)


def build_parser():
    parser = DashValueParser(
        prog="python -m parallel.plan",
        description="Rank data × tensor × pipeline parallel layouts by estimated step time. The search "
                    f"refuses more than {MAX_SEARCH_STEPS:,} steps (pp² + n_layer per candidate layout, "
                    "about a minute).")
    parser.add_argument("--config", choices=sorted(CONFIGS), help="named model config")
    parser.add_argument("--model", choices=["gpt", "bert"], default="gpt",
                        help="bert: the same blocks, a segment embedding and an MLM head tied to the embedding")
    parser.add_argument("--experts", type=int, help="a mixture of experts: E expert MLPs in every --moe-every-th "
                        "block; the search also tries expert parallelism (ep dividing dp and E)")
    parser.add_argument("--top-k", type=int, default=2, help="experts each token runs (with --experts; default 2)")
    parser.add_argument("--moe-every", type=int, default=1, help="every M-th block is a mixture of experts "
                        "(with --experts; default 1: all)")
    parser.add_argument("--n-layer", type=int, help=f"number of transformer blocks, ≤ {LIMITS['n_layer']:,}")
    parser.add_argument("--d-model", type=int, help=f"hidden size h, ≤ {LIMITS['d_model']:,}")
    parser.add_argument("--n-head", type=int, help=f"attention heads a, ≤ {LIMITS['n_head']:,}")
    parser.add_argument("--vocab", type=int, help=f"vocabulary size V, ≤ {LIMITS['vocab']:,}")
    parser.add_argument("--seq", type=int, help=f"sequence length s (block_size), ≤ {LIMITS['seq']:,}")
    parser.add_argument("--batch", type=int, help="global batch in sequences per step "
                        f"(default: the named config's usual batch), ≤ {LIMITS['batch']:,}")
    parser.add_argument("--devices", type=int, default=1, help=f"number of devices (ranks), ≤ {LIMITS['devices']:,}")
    parser.add_argument("--device", default="laptop-cpu", help="device profile: one of "
                        f"{', '.join(packaged_profiles())}, a calibrated name, or a JSON path")
    parser.add_argument("--mem-per-device", type=parse_size,
                        help="memory per device, e.g. 8GB or 8GiB (default: the profile's)")
    parser.add_argument("--dtype", choices=["auto", *PRECISIONS, "fp16", "bf16", "fp8-delayed", "fp8-blockwise"],
                        default="auto", help="float32, float64, or mixed (16-bit with fp32 master + states); "
                        "fp16/bf16/fp8-*: the precision policy as `python -m parallel.train --precision` keeps it "
                        "(fp16/bf16: +4 bytes of fp32 master gradient; fp8: the blocks' linears at the device's "
                        "float8 peak, e.g. --device h100-80gb); auto = mixed if the device has 16-bit flops, else float32")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                        help="pipeline schedule: sets the bubble and the micro-batches in flight per stage")
    parser.add_argument("--compress", default="none", help="dp gradient compression, as parallel.train's "
                        "--compress (none, powersgd:R, topk:RATIO, sign)")
    parser.add_argument("--local-steps", type=int, default=1, metavar="H",
                        help="local SGD: one dp all-reduce of the parameters every H steps")
    parser.add_argument("--allow-inter-node-tp", action="store_true",
                        help="also try tp larger than the devices per node")
    parser.add_argument("--max-cp", type=int, default=1,
                        help="also try context parallelism (the sequence split, ring attention) up to this many ranks")
    parser.add_argument("--longest-sequence", action="store_true",
                        help="print the longest sequence that fits (without cp, and with cp up to --max-cp)")
    parser.add_argument("--top", type=int, default=10, help="rows of the ranked table")
    parser.add_argument("--explain", type=int, metavar="RANK",
                        help="print the derivation of the table row RANK (1 = best)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure this machine and write a laptop-cpu-calibrated profile")
    parser.add_argument("--output", help="where --calibrate writes (default: the cache dir)")
    parser.add_argument("--auto-shard", action="store_true",
                        help="search the tensor-parallel sharding of one traced block over --devices ranks "
                        "(micro-batch: --batch sequences) and print it (parallel.plan.auto); the block runs "
                        f"here: at most {MAX_MEASURED_BYTES / 2**30:.3g} GiB of it")
    cluster_cli.add_flags(parser)
    parser.add_argument("--simulate", action="store_true",
                        help="also predict the top rows by replaying their pipeline schedule with part costs "
                        "measured on this machine (parallel.plan.simulate): one block of each row's "
                        f"micro-batch runs here, at most {MAX_MEASURED_BYTES / 2**30:.3g} GiB of it")
    return parser


def model_config(args, parser):
    """The model of --config with the dims given, or of the dims alone; parser.error if they do not make one."""
    given = {field: getattr(args, arg) for arg, field in DIMS.items() if getattr(args, arg)}
    if not args.config and len(given) < len(DIMS):
        missing = [f"--{arg.replace('_', '-')}" for arg, f in DIMS.items() if f not in given]
        parser.error(f"give --config or all model dims; missing {' '.join(missing)}")
    if args.experts:
        if args.model == "bert" or args.top_k > args.experts:
            parser.error(f"--experts {args.experts} needs --model gpt and --top-k {args.top_k} ≤ --experts")
        given.update(n_experts=args.experts, top_k=args.top_k, moe_every=args.moe_every)
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
                     est.layout.flags(), gib(mem["params"]), gib(mem["grads"]),
                     gib(mem["optim"]), gib(mem["activations"]), gib(mem["total"]),
                     f"{time['compute']:.3g}", f"{time['comm']:.3g}", f"{time['bubble']:.3g}",
                     f"{time['total']:.4g}", est.reason()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in rows)


POSITIVE_INTS = ("n_layer", "d_model", "n_head", "vocab", "seq", "batch", "devices", "mem_per_device", "top", "explain",
                 "max_cp", "local_steps", "experts", "top_k", "moe_every")


def main(argv=None):
    parser = build_parser()
    args = parse_checked(parser, argv, dict.fromkeys(POSITIVE_INTS, AT_LEAST_1))
    too_large = bad_flag(args, {dest: at_most(high) for dest, high in LIMITS.items()})
    if too_large:
        parser.error(f"{too_large}, the planner's bound")
    if args.validate_published or args.layout or args.json:
        return cluster_cli.run(args, parser, model_config)
    if args.calibrate:
        from .calibrate import calibrate
        calibrate(args.output)
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
        dtype = resolve_dtype(args.dtype, profile)
        if args.longest_sequence:
            return print_longest_sequences(config, args, batch, profile, dtype)
        result = plan(config, args.devices, batch, profile, args.mem_per_device, dtype,
                      args.schedule, args.allow_inter_node_tp, args.max_cp, args.compress, args.local_steps)
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
          f"{' with fp32 master' if dtype in ('mixed', 'fp16', 'bf16') else ''}), "
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
    one_block = replace(config, n_layer=1)
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
        simulated = simulate_step(config, layout, batch, parts[(b, layout.tp)], profile, dtype=dtype).total
        print(f"{index:<3}{layout.name():<16}{layout.micro_batches:>3}{est.time['total']:>11.4g}{simulated:>13.4g}")


def print_longest_sequences(config, args, batch, profile, dtype):
    """The longest sequence that fits without cp and, with --max-cp > 1, with cp up to it."""
    limit = args.mem_per_device or profile["memory_gib"] * 2**30
    found = {max_cp: longest_sequence(config, args.devices, batch, profile, args.mem_per_device, dtype,
                                      args.schedule, args.allow_inter_node_tp, max_cp)
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
