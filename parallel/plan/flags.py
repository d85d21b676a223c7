"""`python -m parallel.plan`'s command line: its flags, their bounds and the memory sizes it reads."""
import argparse
import math
import re

from minitensor.flags import DashValueParser
from minitensor.nn.attention_kernels import KERNELS

from . import cluster_cli
from .layout import PRECISIONS, SCHEDULES
from .model import CONFIGS
from .profiles import packaged_profiles
from .search import MAX_SEARCH_STEPS

UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
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
    parser.add_argument("--top-k", type=int, help="experts each token runs (with --experts; default 2)")
    parser.add_argument("--moe-every", type=int, help="every M-th block is a mixture of experts "
                        "(with --experts; default 1: all)")
    parser.add_argument("--expert-hidden", type=int, help="an expert's hidden width (fine-grained experts; with "
                        "--experts; default the MLP's)")
    parser.add_argument("--shared-experts", type=int, default=0, help="experts every token runs beside its routed "
                        "ones (with --experts; default 0)")
    parser.add_argument("--aux-loss-scope", choices=("sequence", "batch"), default="sequence",
                        help="the balancing loss's token group: its shares are all-reduced over cp (sequence) or "
                        "dp·cp (batch) ranks per MoE block and micro-batch (with --experts)")
    parser.add_argument("--max-ranks-per-token", type=int, help="device-limited routing: a token's experts on at most "
                        "M ep ranks (with --experts; the search tries only the ep that hold top-k on M ranks, and "
                        "charges the all-to-all min(M, the uniform fan-out) rows per token)")
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
    parser.add_argument("--dtype", choices=["auto", *PRECISIONS, "fp16", "bf16", "fp8-current", "fp8-delayed", "fp8-blockwise"],
                        default="auto", help="float32, float64, or mixed (16-bit with fp32 master + states); "
                        "fp16/bf16/fp8-*: the precision policy as `python -m parallel.train --precision` keeps it "
                        "(fp16/bf16: +4 bytes of fp32 master gradient; fp8: the blocks' linears at the device's "
                        "float8 peak, e.g. --device h100-80gb); auto = mixed if the device has 16-bit flops, else float32")
    parser.add_argument("--moment-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="AdamW's two moments: float32 (default; the masters' dtype) or bfloat16, 2 bytes each "
                        "(parallel.train --moment-dtype; with a policy --dtype, fp32 or float32/float64)")
    parser.add_argument("--attention", choices=KERNELS, default="dense",
                        help="attention kernel: flash keeps no T×T probabilities (activation memory only)")
    parser.add_argument("--schedule", choices=SCHEDULES + ("any",), default="1f1b",
                        help="pipeline schedule: sets the bubble and the micro-batches in flight per stage "
                        "(any: search them all; dualpipe and dualpipev need m ≥ 2·pp)")
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
    parser.add_argument("--try-splits", action="store_true",
                        help="also try uneven splits of the blocks over the pipeline stages (balanced by flops with the "
                        "head costed, and the first and last stage a block lighter; shown as split=..., a "
                        "`parallel.train --balance`)")
    parser.add_argument("--simulate", action="store_true",
                        help="also predict the top rows by replaying their pipeline schedule with part costs "
                        "measured on this machine (parallel.plan.simulate): one block of each row's "
                        f"micro-batch runs here, at most {MAX_MEASURED_BYTES / 2**30:.3g} GiB of it")
    return parser


POSITIVE_INTS = ("n_layer", "d_model", "n_head", "vocab", "seq", "batch", "devices", "mem_per_device", "top", "explain",
                 "max_cp", "local_steps", "experts", "top_k", "moe_every", "expert_hidden",
                 "max_ranks_per_token")
