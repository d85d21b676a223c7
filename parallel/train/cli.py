"""The command line of `python -m parallel.train`: flags, their checks, and the launch.

Every flag, and every file the run will read or write, is checked before any rank
builds anything, so a bad layout is one clear message (printed once, by rank 0; every
rank exits with status 2) instead of a hang or a failure after hours of training.
"""
import argparse
import sys

from minitensor.flags import DashValueParser
from minitensor.nn.attention_kernels import KERNELS

from ..checkpoint.files import CheckpointError
from ..comm import run_threads
from ..comm.checks import timeout_problem
from ..comm.gather import all_gather_json
from ..comm.link import LINKS
from ..context_parallel import COMM_TYPES as CP_COMM_TYPES
from ..context_parallel import LAYOUTS as CP_LAYOUTS
from ..data_parallel.comm_hooks import METHODS
from ..pipeline.registry import SCHEDULES
from .errors import configure_world, log_errors_to, seconds, write_error_file
from .finite import TrainingStopped
from .flag_checks import FP8_PRECISIONS, check_args
from .loop import model_config, train
from .preflight import check_outputs
from .task import make_task, task_defaults

EXAMPLES = """examples:
  python -m parallel.train                                   # one process, the addition task
  python -m parallel.train --threads 8 --dp 2 --tp 2 --pp 2 --microbatches 4
  mpiexec -n 8 python -m mpi4py -m parallel.train --dp 2 --tp 2 --pp 2 --microbatches 4 --schedule 1f1b
  python -m parallel.train --threads 4 --tp 2 --pp 2 --check  # compare with one device (float64)
  python -m parallel.train --model bert --threads 4 --tp 2 --pp 2 --check   # BERT, the same layers
  python -m parallel.train --threads 4 --cp 2 --tp 2 --check   # context parallel: ring attention
  python -m parallel.train --threads 4 --cp 2 --tp 2 --attention flash --check  # tiled attention in the ring
  python -m parallel.train --threads 4 --dp 4 --ep 2 --experts 4 --top-k 2 --check  # mixture of experts
  python -m parallel.train --precision bf16                  # 16-bit compute, float32 master weights
  python -m parallel.train --threads 4 --tp 2 --pp 2 --precision fp16 --check  # vs one device, same policy
  python -m parallel.train --threads 4 --dp 2 --tp 2 --precision fp8-delayed --check  # same FP8 recipe, 1e-9
  python -m parallel.train --threads 4 --dp 2 --tp 2 --precision fp8-current --check  # amax reduced per cast
  python -m parallel.train --threads 4 --dp 4 --zero 3 --moment-dtype bfloat16 --check  # AdamW's moments in bf16

checkpoints (--save DIR): saved every --save-every steps and after the last; after saving
step N the newest two at or below N are kept, and a checkpoint newer than N is never
deleted. DIR must hold no checkpoint, unless this run resumes from DIR's own step S and
DIR holds none newer than S; --overwrite lets the run replace those in the way, deleting
them only once it has saved its own first checkpoint. A save that fails removes its
partial step_N.tmp and stops the run, naming the last good checkpoint. --resume DIR
continues up to --steps in total (which must exceed its step), and must be of this
model, --dtype and --local-steps (checked before anything is built).
Under --local-steps a checkpoint (at any step, between outer steps too) holds every
replica's own parameters and AdamW moments and the outer optimizer's anchor and momentum:
it resumes exactly, with --local-steps, in the layout it was saved in.

exit status: 0 done; 1 a save failed, or the loss, a gradient, a weight or an optimizer
state was not finite (the run stops at that step on every rank, and nothing of that step
is saved); 2 bad flags, destinations or $PARALLEL_TIMEOUT, before any training.
"""


def block_counts(text):
    """--balance 3,2,2,3: the blocks of each stage, in stage order."""
    try:
        return [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


def build_parser():
    p = DashValueParser(prog="python -m parallel.train", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Train a small GPT with data × tensor × pipeline (× context) parallelism.")
    model = p.add_argument_group("model and data (defaults: minitensor.data.recommended_config())")
    model.add_argument("--model", choices=["gpt", "bert"], default="gpt",
                       help="gpt: next-token addition; bert: fill in masked digits (MLM, 15%% / 80-10-10)")
    model.add_argument("--n-layer", type=int, help="transformer blocks")
    model.add_argument("--n-head", type=int, help="attention heads (divisible by --tp)")
    model.add_argument("--d-model", type=int, help="hidden size (divisible by --n-head)")
    model.add_argument("--block-size", type=int, help="context length (--data only; addition: 3·digits + 2)")
    model.add_argument("--attention", choices=KERNELS, default="dense",
                       help="attention kernel: dense (MatMul, Softmax, MatMul: keeps the T×T probabilities) or flash "
                            "(tiled, keeps O and L only; --check compares it with the dense one-device model)")
    model.add_argument("--attention-block", type=int, metavar="N",
                       help="flash attention's tile: N queries × N keys (default 64; any N ≥ 1)")
    model.add_argument("--digits", type=int, help="addition task: digits per operand")
    model.add_argument("--data", metavar="FILE.txt", help="train char-level on this text instead of addition")
    train = p.add_argument_group("training")
    train.add_argument("--batch", type=int, help="global batch size (divisible by dp × microbatches)")
    train.add_argument("--steps", type=int, help="optimizer steps")
    train.add_argument("--accumulate", type=int, default=1, help="global batches accumulated per optimizer step")
    train.add_argument("--lr", type=float, help="peak AdamW learning rate (linear warm-up, cosine decay to 0)")
    train.add_argument("--warmup", type=int, help="learning-rate warm-up steps")
    train.add_argument("--weight-decay", type=float, help="AdamW weight decay")
    train.add_argument("--dtype", choices=["float32", "float64"], help="parameter dtype (default float32)")
    train.add_argument("--seed", type=int, help="seed of the weights and of the batches")
    train.add_argument("--precision", choices=["fp32", "fp16", "bf16", *FP8_PRECISIONS],
                       help="fp16/bf16: compute in 16 bits, float32 master weights, AdamW states and gradient "
                            "reduction; fp16 with dynamic loss scaling (minitensor.amp). fp8-*: the blocks' "
                            "linears (a mixture's experts too, not its router) multiply FP8 operands (minitensor.fp8), "
                            "the rest stays in --dtype; fp8-current: each cast scales by its own tensor's amax, MAX-reduced "
                            "over the ranks holding the tensor's parts at every cast (one small all-reduce each). "
                            "Default fp32")
    train.add_argument("--moment-dtype", metavar="DTYPE",
                       help="float32 or bfloat16: the dtype AdamW keeps its two moments in (DeepSeek-V3's bf16 "
                            "moments, Megatron-LM's --exp-avg-dtype; the update is computed in the masters' dtype). "
                            "Default: the master weights' dtype"),
    train.add_argument("--fp8-history", type=int, default=16, metavar="N",
                       help="fp8-delayed: steps of amax history (default 16)")
    train.add_argument("--fp8-margin", type=int, default=0, metavar="M", help="fp8-delayed, fp8-current: scale = max/amax/2^M")
    train.add_argument("--fp8-amax", choices=("max", "most_recent"), default="max",
                       help="fp8-delayed: the history's max or its newest amax (default max)")
    train.add_argument("--fp8-tile", type=int, default=128, metavar="T",
                       help="fp8-blockwise: 1×T tiles, T×T weight blocks (default 128, DeepSeek-V3's)")
    layout = p.add_argument_group("layout: world size = dp × tp × pp × cp")
    layout.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage")
    layout.add_argument("--pp", type=int, default=1, help="pipeline stages (ranks)")
    layout.add_argument("--microbatches", type=int, default=1, help="micro-batches per dp rank and step")
    layout.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule")
    layout.add_argument("--chunks", type=int, default=1, help="model chunks per pp rank (interleaved v; dualpipev, dualpipe 2)")
    layout.add_argument("--balance", type=block_counts, default=None, metavar="N,N,...",
                        help="blocks per pipeline stage, pp·chunks of them (default: by parameter count)")
    layout.add_argument("--sequence-parallel", action="store_true", help="shard LayerNorm/dropout regions by sequence")
    layout.add_argument("--recompute-activations", action="store_true",
                        help="recompute each stage's forward in its backward instead of keeping its activations")
    layout.add_argument("--zero", type=int, nargs="?", const=1, default=0, choices=(0, 1, 2, 3), metavar="STAGE",
                        help="ZeRO stage over dp: 1 (plain --zero) shards the AdamW moments, 2 also the "
                        "gradients, 3 also the parameters (0: off)")
    layout.add_argument("--cp", type=int, default=1, help="context-parallel ranks: the sequence split, ring attention")
    layout.add_argument("--cp-layout", choices=CP_LAYOUTS, default="zigzag",
                        help="tokens of each cp rank: zigzag (balanced causal work) or contiguous")
    layout.add_argument("--cp-comm-type", choices=CP_COMM_TYPES, default="p2p",
                        help="cp attention: p2p = ring attention, a2a = Ulysses all-to-alls (heads/tp divisible by cp)")
    moe = p.add_argument_group("mixture of experts (minitensor.nn.moe, parallel.expert_parallel)")
    moe.add_argument("--experts", type=int, default=0, metavar="E", help="experts per MoE block (0: the dense GPT)")
    moe.add_argument("--top-k", type=int, metavar="K", help="experts per token (default min(2, E))")
    moe.add_argument("--ep", type=int, default=1, help="expert-parallel ranks: E/ep experts each; ep divides --dp")
    moe.add_argument("--capacity-factor", type=float, metavar="C", help="at most ⌈C·T·k/E⌉ tokens per expert and "
                     "sequence, the rest dropped (default: dropless)")
    moe.add_argument("--moe-every", type=int, metavar="M", help="every M-th block is MoE (default 1)")
    moe.add_argument("--aux-loss-coef", type=float, metavar="A", help="balancing loss α (default 0.01)")
    moe.add_argument("--aux-loss-scope", default="sequence", metavar="sequence|batch",
                     help="the balancing loss's token group: each sequence (DeepSeek-V3's sequence-wise loss) or "
                     "the whole micro-batch over every dp × cp rank (Switch, Megatron's aux_loss)")
    moe.add_argument("--z-loss-coef", type=float, metavar="B", help="router z-loss β (default 0)")
    moe.add_argument("--expert-hidden", type=int, metavar="H", help="an expert's hidden width (fine-grained "
                     "experts; default the MLP's, 4·d-model)")
    moe.add_argument("--shared-experts", type=int, default=0, metavar="S", help="experts every token runs beside "
                     "its routed ones (default 0)")
    moe.add_argument("--router-score", choices=("softmax", "sigmoid"), default="softmax",
                     help="router scores; sigmoid gates are normalised over the chosen experts (needs --top-k ≥ 2)")
    moe.add_argument("--max-ranks-per-token", type=int, metavar="M", help="device-limited routing: a token's "
                     "experts on at most M of the --ep ranks, chosen by their best scores' sum (default: no limit)")
    moe.add_argument("--expert-bias-rate", type=float, default=0.0, metavar="G", help="loss-free balancing: γ of "
                     "b += γ·sign(mean load − load) after each step (default 0: off)")
    layout.add_argument("--threads", type=int, metavar="N", help="run N ranks as threads of this process (no MPI)")
    comm = p.add_argument_group("communication (parallel.comm.link, parallel.data_parallel.comm_hooks, parallel.data_parallel.local_sgd)")
    comm.add_argument("--link", metavar="NAME|ALPHA,BETA", help="simulate a network: every operation takes at least "
                      "the link's α–β time (" + ", ".join(LINKS) + "; or α s/message,β s/byte)")
    comm.add_argument("--compress", default="none", metavar="|".join(METHODS),
                      help="compress the dp gradient all-reduce, with error feedback (default none)")
    comm.add_argument("--local-steps", type=int, metavar="H",
                      help="local SGD / DiLoCo: H AdamW steps per replica, then average the pseudo-gradients")
    comm.add_argument("--outer-lr", type=float, help="DiLoCo's outer SGD learning rate (default 1 − the momentum: the "
                      "anchor moves as far as the mean replica)")
    comm.add_argument("--outer-momentum", type=float, help="DiLoCo's outer Nesterov momentum (default 0.9)")
    comm.add_argument("--async-staleness", type=int, metavar="S", help="asynchronous parameter server: rank 0 "
                      "serves, --dp workers may compute on parameters up to S rounds old (world = dp + 1)")
    out = p.add_argument_group("checks and output")
    out.add_argument("--check", type=int, nargs="?", const=2, metavar="STEPS",
                     help="compare the first STEPS (2) steps with one device on rank 0; implies float64")
    out.add_argument("--trace", metavar="OUT.json", help="write the last step's Chrome trace of all ranks")
    out.add_argument("--save", metavar="DIR", help="save checkpoints into DIR (see 'checkpoints' below)")
    out.add_argument("--overwrite", action="store_true",
                     help="delete the checkpoints in --save DIR that this run does not continue from")
    out.add_argument("--save-every", type=int, metavar="N", help="save every N steps (and after the last)")
    out.add_argument("--resume", metavar="DIR", help="resume from the latest checkpoint in DIR, or from the step "
                     "directory DIR (any layout)")
    out.add_argument("--eval-every", type=int, default=0, metavar="N", help="evaluate every N steps (0: at the end)")
    out.add_argument("--log-every", type=int, metavar="N", help="progress line every N steps")
    out.add_argument("--log-dir", metavar="DIR", help="each failing rank also writes its one-line error to "
                     "DIR/rank_NNNNN.error (default: --save DIR): a rank cut off from the launcher keeps it there")
    out.add_argument("--timeout", type=seconds, metavar="SECONDS",
                     help="end the job when a rank waits this long for another (default: $PARALLEL_TIMEOUT, else 300; "
                          "this flag wins over the variable)")
    out.add_argument("--debug", action="store_true",
                     help="tracebacks for every error; under MPI, check every collective matches across ranks")
    return p


def fill_defaults(args):
    """Fill the flags left unset from the task's defaults; --check means float64, except under
    --precision fp16/bf16 (float32 masters), which it compares with one device under the same policy.
    Afterwards args.precision names the policy: fp64 and fp32 are --dtype's."""
    if args.precision in ("fp16", "bf16"):
        if args.dtype == "float64":
            raise ValueError(f"--precision {args.precision} keeps float32 master weights; leave out --dtype float64")
        args.dtype = "float32"
    elif args.check is not None:
        if args.dtype == "float32" or args.precision == "fp32":
            raise ValueError("--check compares with one device to 1e-9 and needs --dtype float64 (or leave it unset, "
                             "or compare a 16-bit run under its own policy: --precision fp16 or bf16; an fp8 "
                             "recipe is compared in float64, its exact reference)")
        args.dtype = "float64"
    for name, value in task_defaults(args).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.dtype = args.dtype or "float32"
    if args.attention == "flash" and args.attention_block is None:
        args.attention_block = 64
    if args.experts > 0:  # the MoE flags' defaults; given without --experts they are refused (flag_checks)
        for name, value in (("top_k", min(2, args.experts)), ("moe_every", 1), ("aux_loss_coef", 0.01),
                            ("z_loss_coef", 0.0)):
            setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    if args.precision not in ("fp16", "bf16", *FP8_PRECISIONS):
        args.precision = {"float64": "fp64", "float32": "fp32"}[args.dtype]
    args.log_every = args.log_every or max(1, args.steps // 20)
    return args


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = None if args.timeout else timeout_problem(parser.prog, "fix it, or pass --timeout SECONDS, which wins "
                                                                     "over it")  # read only without --timeout
    if problem:
        parser.exit(2, problem + "\n")
    launched = configure_world(args)
    if args.threads is not None and launched.size > 1:
        parser.error(f"--threads {args.threads} inside an MPI job of {launched.size} ranks: use one or the other")
    log_errors_to(args.log_dir or args.save)
    prefix = f"{parser.prog}: error: " + (f"rank {launched.rank}: " if launched.size > 1 else "")
    error = None
    try:
        fill_defaults(args)
        check_args(args, args.threads or launched.size)
        task = make_task(args)  # the task's own checks: --digits in range, a readable --data file
        notices = check_outputs(args, model_config(args, task))
    except (ValueError, OSError) as exc:
        error = f"{prefix}{exc}\n"
    exit_together(parser, launched, 2, error)
    for notice in notices if launched.rank == 0 else []:
        print(notice, flush=True)
    try:
        if args.threads:
            return run_threads(args.threads, train, args)[0]
        return train(args)
    except (CheckpointError, TrainingStopped) as exc:  # every rank stops alike, with the same message
        line = f"{prefix}{exc}"
        exit_together(parser, launched, 1, f"{line}{write_error_file(line, launched)}\n")


def exit_together(parser, launched, status, error):
    """Exit with `status` if any rank has an `error`, agreed by every rank: one all-gather tells
    each rank which ranks failed, rank 0 prints the first failing rank's message, once, and
    every rank exits normally. It serves where every rank reaches the same point: after the
    start-up checks (which communicate nothing) and when training stops on every rank alike
    (a checkpoint error, a loss that is not finite). No timing decides who prints, and no
    MPI_Abort can cut rank 0's line short."""
    if launched.size == 1:
        if error:
            parser.exit(status, error)
        return
    failed = [message for message in all_gather_json(launched, error) if message]
    if failed:
        if launched.rank == 0:
            print(failed[0], end="", file=sys.stderr, flush=True)
        sys.exit(status)
