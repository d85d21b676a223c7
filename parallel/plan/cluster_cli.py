"""The command line of the GPU-cluster model (plan.cluster): --layout [--json] and --validate-published.

    python -m parallel.plan --n-layer 128 --d-model 25600 --n-head 160 --vocab 51200 --seq 2048 \\
        --batch 3072 --devices 3072 --device a100-80gb --layout tp=8,pp=64,dp=6 --json
    python -m parallel.plan --validate-published

--json prints ONE JSON object (a stable interface; keys are only ever added): step_seconds,
tflops_per_device (the Megatron paper's model flops), memory_bytes_per_device, fits, the layout
(tp, pp, dp, micro_batch, micro_batches, v, recompute), sequence_parallel, and the seconds and bytes
behind them. Without m or v in --layout the fastest fitting micro-batch size and interleaving are
chosen; recompute=full (the default) or selective and sp=1 (sequence parallelism) pick Korthikanti et
al. 2022's modes; split=even|balanced how the blocks are cut into stages (stage_split.py; without it the
faster), printed as the blocks per stage; schedule=1f1b|dualpipe|dualpipev the pipeline schedule (plan.dual;
1f1b, interleaved when v > 1, unless given here or by --schedule; --schedule any: the fastest).
"""
import json

from .cluster import DDP, SCHEDULES, figures, layout_error, model_flops
from .cluster_search import best_steps, why_none_runs, with_micro_batches
from .profiles import load_profile
from .stage_split import SPLITS

KEYS = {"tp", "pp", "dp", "m", "v"}
MODES = {"recompute": ("full", "selective"), "sp": ("0", "1"), "ddp": DDP, "split": SPLITS,
         "schedule": SCHEDULES}  # words, not counts
VALUE = {"recompute": str, "sp": lambda value: value == "1", "ddp": str, "split": str, "schedule": str}   # how each key's text is read (the rest: int)


def add_flags(parser):
    parser.add_argument("--layout", help="cost one layout on a GPU cluster (a profile with 'cluster' figures): "
                        "tp=T,pp=P,dp=D[,m=MICRO-BATCH SIZE][,v=CHUNKS][,recompute=full|selective][,sp=0|1]"
                        "[,ddp=local|torch][,split=even|balanced][,schedule=1f1b|dualpipe|dualpipev]; "
                        "Megatron-LM's step")
    parser.add_argument("--json", action="store_true", help="with --layout: print one JSON object; without it "
                        "(a GPU-cluster --device): a JSON list of the --top K best layouts, each its best m, v, DDP")
    parser.add_argument("--validate-published", action="store_true",
                        help="predicted vs published TFLOP/s per GPU for Megatron-LM's Table 1 (Narayanan et al. "
                        "2021), then the held-out Korthikanti et al. 2022 Table 5, the 2021 Table 2 (the "
                        "calibration) and the held-out sweep orderings")


def parse_layout(text):
    """'tp=8,pp=64,dp=6,m=1,v=2,recompute=selective,sp=1,ddp=local' -> {"tp": 8, ..., "recompute": "selective",
    "sp": True, "ddp": "local"}; ValueError naming the bad part."""
    parts = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key in MODES and value not in MODES[key]:
            raise ValueError(f"--layout {text!r}: {item!r}: {key} is one of {', '.join(MODES[key])}")
        if key not in MODES and (key not in KEYS or not value.isascii() or not value.isdigit() or int(value) < 1):
            raise ValueError(f"--layout {text!r}: {item!r} is not one of tp=, pp=, dp=, m=, v= with a positive int, "
                             "recompute=full|selective, sp=0|1, ddp=local|torch, split=even|balanced or "
                             "schedule=1f1b|dualpipe|dualpipev")
        if key in parts:
            raise ValueError(f"--layout {text!r}: {key} given twice")
        parts[key] = VALUE.get(key, int)(value)
    missing = {"tp", "pp", "dp"} - set(parts)
    if missing:
        raise ValueError(f"--layout {text!r} lacks {', '.join(sorted(missing))}")
    return parts


def cluster_profile(args):
    """The --device profile (with --mem-per-device), ValueError if it has no GPU-cluster figures."""
    profile = load_profile(args.device)
    figures(profile)
    return {**profile, "memory_gib": args.mem_per_device / 2**30} if args.mem_per_device else profile


def cluster_schedule(args):
    """--schedule for the cluster: a name, or None (any: search 1f1b, dualpipe and dualpipev)."""
    return None if args.schedule == "any" else args.schedule


def described(st, config, batch, profile):
    """One layout as the CLI prints it in JSON."""
    return {"device": profile["name"], "model_flops_per_step": model_flops(config, batch),
            **with_micro_batches(st, batch)}


def top_layouts(config, profile, devices, batch, k, schedule="1f1b"):
    """The k best (tp, pp, dp), each at its best micro-batch, interleaving and DDP, fitting ones first."""
    best = {}
    for st in best_steps(config, profile, devices, batch, schedule=schedule):   # fastest first: the first of each (tp, pp, dp)
        best.setdefault((st.tp, st.pp, st.dp), st)
    if not best:
        raise ValueError(f"no layout of {devices} GPUs runs this model (of the (tp, pp, dp) tried: "
                         f"{why_none_runs(config, profile, devices, batch)})")
    return [{"tp": st.tp, "pp": st.pp, "dp": st.dp, **described(st, config, batch, profile)}
            for st in list(best.values())[:k]]


def run(args, parser, model_config):
    """Exit code of --validate-published, --layout, or --top K --json (parser.error on bad input)."""
    if args.validate_published:
        ignored = [flag for flag, given in (("--json", args.json), ("--layout", args.layout is not None),
                                            ("--devices", args.devices != 1)) if given]
        if ignored:
            parser.error(f"--validate-published runs the published layouts on their own devices and prints a "
                         f"table; it takes no {', '.join(ignored)}")
        from .published import validate_published
        validate_published()
        return 0
    config = model_config(args, parser)
    flag = "--layout" if args.layout is not None else "--json"
    if args.batch is None:
        parser.error(f"{flag} needs --batch (global batch in sequences)")
    try:
        profile = cluster_profile(args)
        if args.layout is None:  # --top K --json: the K best layouts of the cluster
            print(json.dumps(top_layouts(config, profile, args.devices, args.batch, args.top, cluster_schedule(args))))
            return 0
        parts = parse_layout(args.layout)
        if parts["tp"] * parts["pp"] * parts["dp"] != args.devices:
            raise ValueError(f"--layout tp·pp·dp = {parts['tp'] * parts['pp'] * parts['dp']} is not "
                             f"--devices {args.devices}")
        steps = best_steps(config, profile, args.devices, args.batch, parts["tp"], parts["pp"], parts["dp"],
                           parts.get("m"), parts.get("v"), max_micro_batch=parts.get("m", 16),
                           recompute=parts.get("recompute", "full"), sequence_parallel=parts.get("sp", False),
                           ddp=parts.get("ddp"), split=parts.get("split"),
                           schedule=parts.get("schedule", cluster_schedule(args)))
    except ValueError as error:
        parser.error(f"{flag}: {error}" if flag == "--json" else str(error))
    if not steps:
        why = layout_error(config, args.devices, args.batch, parts["tp"], parts["pp"], parts["dp"],
                           parts.get("m", 1), parts.get("v", 1), figures(profile)["gpus_per_node"],
                           parts.get("recompute", "full"), parts.get("sp", False), parts.get("ddp", "local"),
                           parts.get("schedule", cluster_schedule(args) or "1f1b"))
        parser.error(f"--layout {args.layout}: {why or 'no micro-batch size ≤ 16 and interleaving runs it'}")
    best = steps[0]
    out = described(best, config, args.batch, profile)
    if args.json:
        print(json.dumps(out))
    else:
        lay = out["layout"]
        print(f"{config} on {args.devices} × {profile['name']}, batch {args.batch}: tp={lay['tp']} pp={lay['pp']} "
              f"dp={lay['dp']} micro-batch {lay['micro_batch']} × {lay['micro_batches']} v={lay['v']}, "
              f"{lay['recompute']} recompute, {out['ddp']} DDP, schedule {lay['schedule']}"
              f"{', sequence parallel' if out['sequence_parallel'] else ''}")
        print(f"blocks per stage ({'uneven' if len(set(best.split)) > 1 else 'even'}): {best.split}")
        print(f"step {best.seconds['step']:.4g} s = " + ", ".join(
            f"{k} {v:.3g}" for k, v in best.seconds.items() if k not in ("step", "gemm", "memory_bound")))
        print(f"{best.tflops:.1f} TFLOP/s per GPU (model flops, the paper's eq. 3); memory "
              f"{best.memory['total'] / 2**30:.1f} GiB of {best.limit / 2**30:.0f} ({'fits' if best.fits else 'DOES NOT FIT'})")
    return 0 if best.fits else 1
