"""Every flag of `python -m parallel.train` checked before any work: alone (RANGES), against
the training dtype (FLOAT_FLAGS) and in combination (check_args), each error one message
that names the values."""
import os
from pathlib import Path

import numpy as np

from minitensor.amp import POLICIES, precision_policy
from minitensor.flags import AT_LEAST_0, AT_LEAST_1, NON_NEGATIVE, POSITIVE, bad_flag
from minitensor.nn.moe import AUX_LOSS_SCOPES

from ..comm.link import parse_link
from ..context_parallel import check_sequence_length
from ..data_parallel.comm_hooks import make_hook
from ..expert_parallel.composes import expert_composition_problem, moe_block_problem
from ..pipeline.partition import check_balance
from ..pipeline.placement import num_stages
from ..pipeline.registry import placement_of

FP8_PRECISIONS = tuple(name for name in POLICIES if name.startswith("fp8-"))  # --precision's FP8 recipes

RANGES = {**dict.fromkeys(("dp", "tp", "pp", "cp", "microbatches", "chunks", "accumulate", "batch", "steps", "n_layer",
                            "n_head", "d_model", "block_size", "threads", "check", "local_steps", "ep", "top_k",
                            "moe_every", "expert_hidden", "max_ranks_per_token", "attention_block", "fp8_history",
                            "fp8_tile"), AT_LEAST_1), "fp8_margin": AT_LEAST_0,
          "experts": AT_LEAST_0, "shared_experts": AT_LEAST_0, "expert_bias_rate": NON_NEGATIVE, "capacity_factor": POSITIVE, "aux_loss_coef": NON_NEGATIVE,
          "z_loss_coef": NON_NEGATIVE,
          "moment_dtype": ("float32 or bfloat16 (AdamW's moments; leave it out for the masters' dtype)",
                           lambda v: v in ("float32", "bfloat16")),
          "lr": POSITIVE, "weight_decay": NON_NEGATIVE, "outer_lr": POSITIVE,
          "outer_momentum": ("a finite number in [0, 1)", lambda v: 0 <= v < 1),
          **dict.fromkeys(("warmup", "seed", "eval_every", "save_every", "log_every", "async_staleness"),
                        AT_LEAST_0)}
FLOAT_FLAGS = ("lr", "weight_decay", "outer_lr", "outer_momentum", "aux_loss_coef", "z_loss_coef")  # every float the optimizers multiply by


def check_float_range(args):
    """A float flag finite as a Python float can still overflow the training dtype: --lr 1e39 is
    inf in float32, and its first step makes every weight inf. Refuse it, naming the largest value."""
    largest = np.finfo(args.dtype).max
    for name in FLOAT_FLAGS:
        value = getattr(args, name)
        if value is not None and abs(value) > float(largest):
            raise ValueError(f"--{name.replace('_', '-')}={value} is out of range for the training dtype "
                             f"{args.dtype} (largest {largest:.3g}); give a value below it")


def check_args(args, world_size):
    """A ValueError naming the values for every flag combination that cannot run."""
    message = bad_flag(args, RANGES)
    if message:
        raise ValueError(message)
    check_float_range(args)
    server = args.async_staleness is not None  # --async-staleness: one more rank, the parameter server
    layout = args.dp * args.tp * args.pp * args.cp + server
    if layout != world_size:
        cp = f" x --cp {args.cp}" if args.cp > 1 else ""
        raise ValueError(f"--dp {args.dp} x --tp {args.tp} x --pp {args.pp}{cp}{' + 1 server' if server else ''} = "
                         f"{layout} ranks, but the world has {world_size}")
    if args.n_head % args.tp:
        raise ValueError(f"--n-head {args.n_head} is not divisible by --tp {args.tp}")
    if args.d_model % args.n_head:
        raise ValueError(f"--d-model {args.d_model} is not divisible by --n-head {args.n_head}")
    if args.batch % (args.dp * args.microbatches):
        raise ValueError(f"--batch {args.batch} is not divisible by --dp {args.dp} x --microbatches "
                         f"{args.microbatches} = {args.dp * args.microbatches}")
    if args.cp > 1 and args.model == "bert":
        raise ValueError(f"--cp {args.cp} with --model bert: a BERT's segment of each token counts the separators "
                         "before it in the whole sequence, which a cp rank does not hold; use --cp 1")
    if args.cp > 1:
        try:
            check_sequence_length(args.block_size, args.cp, args.cp_layout)
        except ValueError as error:
            raise ValueError(f"--cp {args.cp} --cp-layout {args.cp_layout}: {error} ({length_hint(args)})") from None
        if args.cp_comm_type == "a2a" and args.n_head // args.tp % args.cp:
            raise ValueError(f"--cp-comm-type a2a needs the heads per tp rank, --n-head {args.n_head} / --tp "
                             f"{args.tp} = {args.n_head // args.tp}, divisible by --cp {args.cp}")
        if args.sequence_parallel and args.block_size // args.cp % args.tp:
            raise ValueError(f"--sequence-parallel with --cp {args.cp} needs the sequence length {args.block_size} "
                             f"/ cp = {args.block_size // args.cp} divisible by --tp {args.tp}")
    if args.sequence_parallel and args.tp == 1:
        raise ValueError("--sequence-parallel shards by sequence what the tp ranks would each repeat, but --tp is 1")
    if args.sequence_parallel and args.block_size % args.tp:
        raise ValueError(f"--sequence-parallel needs the sequence length {args.block_size} divisible by "
                         f"--tp {args.tp} ({length_hint(args)})")
    if args.schedule in ("dualpipev", "dualpipe"):
        check_dualpipe_args(args)
    stages = num_stages(args.pp, args.chunks, placement_of(args.schedule))
    layout = f"--pp {args.pp}" + (f" x --chunks {args.chunks}" if stages > args.pp else "")
    if stages > args.n_layer:
        raise ValueError(f"{layout} stages need --n-layer ≥ {stages}, got {args.n_layer}")
    if args.balance is not None:
        try:
            check_balance(args.balance, args.n_layer, stages)
        except ValueError as error:
            raise ValueError(f"--balance: {error} ({layout})") from None
    if args.chunks > 1 and args.schedule not in ("interleaved", "dualpipev", "dualpipe"):
        raise ValueError(f"--chunks {args.chunks} needs --schedule interleaved")
    if args.schedule == "interleaved" and args.chunks > 1 and args.microbatches % args.pp:
        raise ValueError(f"--schedule interleaved needs --microbatches {args.microbatches} divisible by --pp {args.pp}")
    precision_of(args)  # bf16 without the ml_dtypes package: how to install it
    check_fp8_args(args)
    if args.check and args.resume:
        raise ValueError("--check trains the single-device model from the initial weights; it cannot follow --resume")
    if args.model == "bert" and args.data:
        raise ValueError("--model bert trains on the masked addition task; --data is for --model gpt")
    if args.attention_block is not None and args.attention != "flash":
        raise ValueError(f"--attention-block {args.attention_block} sets flash attention's tiles; add --attention flash")
    check_communication_args(args)
    check_expert_args(args)
    if args.log_dir:
        check_log_dir(args.log_dir)
    if args.save_every and not args.save:
        raise ValueError("--save-every needs --save DIR")
    if args.overwrite and not args.save:
        raise ValueError("--overwrite needs --save DIR")


def check_log_dir(directory):
    """--log-dir is written when a rank fails: a directory there must be possible now, not found impossible then."""
    existing = next(path for path in (Path(directory), *Path(directory).parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(f"--log-dir {directory}: {existing} is a file, so no directory can be made there")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--log-dir {directory}: {existing} is not writable")


def check_dualpipe_args(args):
    """DualPipeV folds 2·pp stages over pp ranks, DualPipe holds pp stages twice, down and up the
    ranks (pipeline.dualpipe): two chunks, at least 2·pp micro-batches; DualPipe pairs rank r with
    pp-1-r (pp even) and sends m/2 each way (m even)."""
    name, held = args.schedule, {"dualpipev": "r and 2·pp-1-r", "dualpipe": "r and the mirrored copy of pp-1-r"}
    if args.chunks != 2:
        raise ValueError(f"--schedule {name} holds two stages per pp rank ({held[name]}): give --chunks 2, "
                         f"got --chunks {args.chunks}")
    if name == "dualpipe" and args.pp % 2:
        raise ValueError(f"--schedule dualpipe pairs pp rank r with pp-1-r: give an even --pp, got --pp {args.pp}")
    if args.microbatches < 2 * args.pp or (name == "dualpipe" and args.microbatches % 2):
        even = " even (m/2 each way)" if name == "dualpipe" else ""
        raise ValueError(f"--schedule {name} needs{even} --microbatches ≥ 2·pp = {2 * args.pp}, got {args.microbatches}")
    if args.model == "bert":
        raise ValueError(f"--schedule {name} with --model bert: it puts both ends of the model on pp rank 0, "
                         "where the tied embedding's two uses are one parameter, not two copies to sum; use 1f1b")


def precision_of(args):
    """The precision policy the flags name (an FP8 recipe with its settings, in --dtype; AdamW's
    moments in --moment-dtype)."""
    if not args.precision.startswith("fp8-"):
        return precision_policy(args.precision, moment_dtype=args.moment_dtype)
    recipe = ({"tile": args.fp8_tile} if args.precision == "fp8-blockwise" else {"margin": args.fp8_margin}
              if args.precision == "fp8-current"
              else {"history": args.fp8_history, "margin": args.fp8_margin, "amax_compute": args.fp8_amax})
    return precision_policy(args.precision, args.dtype, args.moment_dtype, **recipe)


def check_fp8_args(args):
    """An FP8 recipe's settings and the layouts it composes with. Blockwise: a tile must not
    straddle two ranks' parts, so t divides every contracted or split size a rank holds: the
    hidden size, the attention and MLP widths per tp rank, and the shortest run of one
    sequence's consecutive tokens on a rank (the weight-gradient product's tiles run along
    the tokens): T/cp, or T/(2·cp) under zigzag."""
    if not args.precision.startswith("fp8-"):
        return
    flag = f"--precision {args.precision}"
    if args.dtype == "float64" and not args.check:
        raise ValueError(f"{flag} with --dtype float64: FP8 operands summed in float64 are --check's exact reference, "
                         f"not a way to train (FP8 hardware accumulates in float32); leave out --dtype, or add --check")
    if args.precision != "fp8-blockwise":
        return
    run = args.block_size // args.cp // (2 if args.cp > 1 and args.cp_layout == "zigzag" else 1)
    for what, size in (("--d-model", args.d_model), ("--d-model / --tp", args.d_model // args.tp),
                       ("the MLP width 4·d-model / --tp", 4 * args.d_model // args.tp),
                       ("the tokens in a row on one rank (T/cp, zigzag: T/(2cp))", run)):
        if size % args.fp8_tile:
            raise ValueError(f"{flag} --fp8-tile {args.fp8_tile} does not divide {what} = {size}: a tile "
                             f"would straddle two ranks' parts, and the layout would quantize other tiles than one "
                             f"device; choose a tile that divides it")


def length_hint(args):
    """Which flag sets the sequence length of this run's task."""
    if args.data:
        return "on --data the length is --block-size; choose another"
    return "addition: the length is 3·digits + 2; try --digits 2"


def check_communication_args(args):
    """--link, --compress, --local-steps and the outer optimizer's flags, alone and together."""
    if args.link is not None:
        parse_link(args.link)
    compress = make_hook(args.compress) is not None
    outer = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in ("outer_lr", "outer_momentum")
             if getattr(args, name) is not None]
    if outer and args.local_steps is None:
        raise ValueError(f"{' and '.join(outer)} set DiLoCo's outer optimizer, which needs --local-steps H")
    if args.async_staleness is not None:
        check_parameter_server_args(args, compress)
    for flag, on in ((f"--compress {args.compress}", compress), (f"--local-steps {args.local_steps}",
                                                                 args.local_steps is not None)):
        if on and args.zero:
            raise ValueError(f"{flag} acts on the dp all-reduce of whole replicas, which --zero {args.zero} replaces "
                             f"by sharding over dp: use one or the other")
        if args.local_steps is not None and args.cp > 1:
            raise ValueError(f"--local-steps {args.local_steps} with --cp {args.cp}: the cp ranks of a replica hold "
                             f"parts of one gradient, which must be summed every step")
        if on and args.dp == 1:
            raise ValueError(f"{flag} acts on the communication over dp, but --dp is 1")
        if on and args.check:
            raise ValueError(f"{flag} changes the mathematics on purpose, so --check's single-device reference "
                             f"does not apply (its exact references are tests/parallel/data_parallel/test_comm_hooks.py and "
                             f"test_local_sgd.py)")


def check_parameter_server_args(args, compress):
    """--async-staleness runs the dense model on dp workers: no other layout or communication flag."""
    flag = f"--async-staleness {args.async_staleness}"
    others = [f"--tp {args.tp}" if args.tp > 1 else None, f"--pp {args.pp}" if args.pp > 1 else None,
              f"--cp {args.cp}" if args.cp > 1 else None, "--model bert" if args.model == "bert" else None,
              "--attention flash" if args.attention == "flash" else None,
              f"--zero {args.zero}" if args.zero else None,
              "--recompute-activations" if args.recompute_activations else None,
              f"--schedule {args.schedule}" if args.schedule != "1f1b" else None,
              f"--chunks {args.chunks}" if args.chunks > 1 else None,
              f"--eval-every {args.eval_every}" if args.eval_every else None,
              f"--precision {args.precision}" if args.precision not in ("fp32", "fp64") else None, f"--compress {args.compress}" if compress else None,
              f"--local-steps {args.local_steps}" if args.local_steps is not None else None,
              f"--microbatches {args.microbatches}" if args.microbatches > 1 else None,
              f"--accumulate {args.accumulate}" if args.accumulate > 1 else None,
              "--check" if args.check else None, "--save" if args.save else None,
              "--resume" if args.resume else None, "--trace" if args.trace else None]
    others = [o for o in others if o]
    if others:
        raise ValueError(f"{flag} trains the dense model on --dp workers around one server; it does not combine "
                         f"with {', '.join(others)}")


def check_expert_args(args):
    """--experts and its flags: E, k, ep and dp agree; the layouts not composed with experts yet refused."""
    if args.aux_loss_scope not in AUX_LOSS_SCOPES:
        raise ValueError(f"--aux-loss-scope {args.aux_loss_scope} is not one of {', '.join(AUX_LOSS_SCOPES)}: the "
                         f"balancing loss's token group is each sequence or the whole micro-batch")
    if not args.experts:
        given = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name, unset in
                 (("ep", 1), ("top_k", None), ("capacity_factor", None), ("moe_every", None),
                  ("aux_loss_coef", None), ("aux_loss_scope", "sequence"), ("z_loss_coef", None), ("expert_hidden", None), ("shared_experts", 0),
                  ("router_score", "softmax"), ("expert_bias_rate", 0.0), ("max_ranks_per_token", None))
                 if getattr(args, name) != unset]
        if given:
            raise ValueError(f"{', '.join(given)} needs --experts E (a mixture of experts)")
        return
    flag = f"--experts {args.experts}"
    if args.top_k > args.experts:
        raise ValueError(f"--top-k {args.top_k} exceeds {flag}: a token cannot choose more experts than there are")
    if args.router_score == "sigmoid" and args.top_k == 1:
        raise ValueError("--router-score sigmoid with --top-k 1: sigmoid gates are normalised over the chosen "
                         "experts, so one expert's gate is always 1 and the router learns nothing; use --top-k 2 or softmax")
    if args.experts % args.ep:
        raise ValueError(f"{flag} is not divisible by --ep {args.ep}: every ep rank holds E/ep experts")
    check_device_limit_flags(args)
    if args.dp % args.ep:
        raise ValueError(f"--ep {args.ep} does not divide --dp {args.dp}: expert parallelism splits the dp ranks")
    if args.sequence_parallel:
        raise ValueError(f"{flag} with --sequence-parallel: the experts run whole on every tp rank's activation, "
                         f"which sequence parallelism splits by position; leave it off")
    if args.cp > 1 and args.capacity_factor is not None:
        raise ValueError(f"--capacity-factor {args.capacity_factor} with --cp {args.cp}: a capacity keeps each "
                         f"sequence's earliest tokens first, which lie on other cp ranks; leave it off (dropless)")
    problem = moe_block_problem(args.n_layer, args.moe_every) or expert_composition_problem(
        args.experts, precision=args.precision, local_steps=args.local_steps, compress=args.compress,
        async_staleness=args.async_staleness, model=args.model)
    if problem:
        raise ValueError(problem)


def check_device_limit_flags(args):
    """--max-ranks-per-token M: at most --ep ranks, and room on M ranks for --top-k experts."""
    limit = args.max_ranks_per_token
    if limit is None:
        return
    if limit > args.ep:
        raise ValueError(f"--max-ranks-per-token {limit} exceeds --ep {args.ep}: a token cannot reach more ranks "
                         f"than hold experts")
    per_rank = args.experts // args.ep
    if limit * per_rank < args.top_k or -(-args.top_k // limit) > per_rank:
        raise ValueError(f"--top-k {args.top_k} does not fit --max-ranks-per-token {limit}: each rank holds "
                         f"{per_rank} experts, and each chosen rank gives ⌈k/M⌉ = {-(-args.top_k // limit)} of them")
