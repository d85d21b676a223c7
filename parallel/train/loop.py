"""One rank's training job: build the 3D model, train, evaluate, report.

Every rank runs `train(args)`; rank 0 prints. The weights come from one seed on every
rank and the batches from (seed, step), so each layout computes the same losses.
"""
import math
import time

import numpy as np

import minitensor as mt
from minitensor.data.masked_addition import SEP
from minitensor.models.bert import BERT, BertConfig
from minitensor.models.gpt import GPT, GPTConfig, use_attention
from minitensor.nn.attention_kernels import attention_kernel

from ..comm.link import parse_link, with_link
from ..data_parallel.comm_hooks import make_hook
from ..hybrid import HybridGPT
from ..mesh import Mesh
from . import report
from .check import TOLERANCES, SingleDeviceCheck
from .errors import configure_world
from .finite import NOTHING_SAVED, check_finite, check_state_finite
from .flag_checks import precision_of
from .preflight import in_the_way_after
from .task import evaluate, global_batch, make_task, sample


def learning_rate(args, step):
    """Linear warm-up over --warmup steps, times a cosine from --lr down to 0 at the last step."""
    warmup = min(1.0, step / args.warmup) if args.warmup else 1.0
    return args.lr * warmup * 0.5 * (1 + math.cos(math.pi * step / args.steps))


def model_config(args, task):
    """The config of the model the flags describe (the start-up checks compare a --resume checkpoint's with it)."""
    sizes = dict(vocab_size=task.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                 n_head=args.n_head, d_model=args.d_model)
    if args.model == "bert":
        return BertConfig(**sizes, sep_id=SEP)
    experts = dict(n_experts=args.experts, top_k=args.top_k, moe_every=args.moe_every,
                   capacity_factor=args.capacity_factor, aux_loss_coef=args.aux_loss_coef,
                   aux_loss_scope=args.aux_loss_scope, z_loss_coef=args.z_loss_coef, expert_hidden=args.expert_hidden,
                   shared_experts=args.shared_experts, router_score=args.router_score,
                   expert_bias_rate=args.expert_bias_rate, max_groups_per_token=args.max_ranks_per_token,
                   expert_groups=args.ep if args.max_ranks_per_token else 1) if args.experts else {}
    return GPTConfig(**sizes, **experts)


def build(args, task, group):
    config = model_config(args, task)
    mt.manual_seed(args.seed)
    gpt = (BERT if args.model == "bert" else GPT)(config, dtype=np.dtype(args.dtype))
    use_attention(gpt, attention_kernel(args.attention, args.attention_block))  # --check's reference: dense
    model = HybridGPT(gpt, Mesh(args.dp, args.tp, args.pp, args.cp, world=group, ep=args.ep),
                      microbatches=args.microbatches,
                      schedule=args.schedule, chunks=args.chunks, balance=args.balance, sequence_parallel=args.sequence_parallel,
                      recompute_activations=args.recompute_activations, zero=args.zero, seed=args.seed,
                      cp_layout=args.cp_layout, cp_comm_type=args.cp_comm_type, precision=precision_of(args))
    model.configure_optimizer(lr=args.lr, weight_decay=args.weight_decay)
    hook = make_hook(args.compress, seed=args.seed)
    if hook is not None:
        model.register_comm_hook(hook)
    if args.local_steps is not None:
        model.configure_local_sgd(args.local_steps, args.outer_lr,
                                  args.outer_momentum if args.outer_momentum is not None else 0.9)
    return model


def say(group, text):
    if group.rank == 0 and text:
        print(text, flush=True)


def train(args):
    """Train on this rank; returns {"losses", "metric", "check"} (metric and check on rank 0)."""
    if args.async_staleness is not None:
        from .async_ps import train_parameter_server  # a run of its own kind: server + workers
        return train_parameter_server(args, learning_rate, say)
    group = with_link(configure_world(args), args.link)  # --link: every group split from it is on it
    task = make_task(args)
    model = build(args, task, group)
    checker = SingleDeviceCheck(model, args, group) if args.check else None
    first, last_good = 1, NOTHING_SAVED
    if args.resume:
        from ..checkpoint import load_checkpoint  # imported only when used: plain training does without it
        resumed = load_checkpoint(args.resume, model)
        first, last_good = resumed["step"] + 1, f"the last good checkpoint is {resumed['path']}, resumed"
    replace_after = in_the_way_after(args) if args.overwrite else None  # until the first save (preflight.py)
    say(group, report.startup_summary(args, model, group))
    if first > 1:
        say(group, f"resumed from {args.resume} after step {first - 1}")
    losses, step_stats = [], {}
    tokens = args.batch * args.block_size * args.accumulate
    start = time.perf_counter()
    for step in range(first, args.steps + 1):
        checking = checker if checker and step < first + args.check else None
        step_start = time.perf_counter()
        loss, step_stats = train_one_step(args, model, task, step, checking, group, losses, last_good)
        step_seconds = time.perf_counter() - step_start
        losses.append(loss)
        done = step - first + 1
        if step % args.log_every == 0 or step == args.steps:
            moe = report.step_state_text(model, group) if args.experts else ""
            say(group, report.progress_line(step, args.steps, loss, tokens * done, time.perf_counter() - start, done)
                + moe)
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            _, metric = evaluation(model, task, group)
            say(group, metric and f"step {step}: {metric[0]}: {metric[1]:.4f}")
        if args.save and ((args.save_every and step % args.save_every == 0) or step == args.steps):
            from ..checkpoint import save_checkpoint  # (as load_checkpoint above)
            saved = save_checkpoint(args.save, model, step=step, extra={"args": vars(args)},
                                    replace_after=replace_after)
            last_good, replace_after = f"the last good checkpoint is {saved}", None
    if model.outer is not None and model.outer.inner_steps:
        model.outer.sync()  # the replicas agree before evaluation
        check_state_finite(model, "outer", args.steps, group, last_good)
    if args.link and first <= args.steps:
        say(group, "\n".join(report.link_lines(step_stats, parse_link(args.link), step_seconds)))
    return finish(args, model, task, group, losses, step_stats, checker, time.perf_counter() - start)


def train_one_step(args, model, task, step, checking, group, losses, last_good=NOTHING_SAVED):
    """One optimizer step over --accumulate global batches; returns (mean loss, this step's
    communication). `checking`: the SingleDeviceCheck to run this step, or None; `losses`:
    those of the steps before and `last_good` where the last checkpoint is (for the message
    if this step's numbers are not finite)."""
    lr = learning_rate(args, step)
    model.optimizer.defaults["lr"] = lr
    batches = [global_batch(task, args, step, k) for k in range(args.accumulate)]
    model.reset_communication_stats()
    loss = float(np.mean([model.train_step(idx, targets) for idx, targets in batches]))
    model.finish_grad_sync()
    sync_stats = model.communication_stats()  # before --check's gathers, which are not part of training
    check_finite(model, loss, step, losses, group, last_good)
    if checking is not None:
        say(group, checking.check_step(model, batches, loss, step, lr))
    model.reset_communication_stats()
    # ZeRO's reduce-scatter and all-gather happen here; after each update, the weights must be finite
    model.optimizer_step(after=lambda update: check_state_finite(model, update, step, group, last_good))
    return loss, report.merge_stats(sync_stats, model.communication_stats())


def evaluation(model, task, group):
    """The gathered single-device model (a collective) and, on rank 0, its metric (name, value)."""
    dense = model.dense_gpt()
    return dense, (evaluate(dense, task) if group.rank == 0 else None)


def finish(args, model, task, group, losses, step_stats, checker, seconds):
    dense, metric = evaluation(model, task, group)
    result = {"losses": losses, "metric": None, "check": None}
    if group.rank == 0:
        name, value = metric
        result["metric"] = value
        print(f"trained {len(losses)} steps in {report.clock(seconds)} ({seconds:.2f} s)", flush=True)
        print(f"{name}: {value:.4f}" + (f" ({value:.1%})" if name.endswith("exact match") else ""), flush=True)
        print("sample:\n" + sample(dense, task), flush=True)
        if model.amp.scaler.enabled:
            print(f"loss scale: {model.amp.scaler.scale:g} at the end; {model.amp.skipped} step(s) skipped for "
                  f"inf/nan gradients", flush=True)
        if checker is not None:
            result["check"] = checker.worst
            print(f"check: largest relative difference to one device over {min(args.check, len(losses))} "
                  f"step(s): {checker.worst:.1e} (tolerance {TOLERANCES[args.precision]:g} "
                  + ("in float64)" if args.precision == "fp64" else f"under the same policy, {args.precision})"),
                  flush=True)
    say(group, report.communication_table(step_stats, group))
    if args.trace:
        report.save_trace(model, group, args.trace)
        say(group, f"wrote the Chrome trace of the last step on all {group.size} ranks to {args.trace} "
                   f"(open it in https://ui.perfetto.dev)")
    return result
