"""One rank's training job: build the 3D model, train, evaluate, report.

Every rank runs `train(args)`; rank 0 prints. The weights come from one seed on every
rank and the batches from (seed, step), so each layout computes the same losses.
"""
import math
import time

import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig

from ..comm import world
from ..hybrid import HybridGPT
from ..mesh import Mesh
from . import report
from .check import TOLERANCE, SingleDeviceCheck
from .task import evaluate, global_batch, make_task, sample


def learning_rate(args, step):
    """Linear warm-up to --lr over --warmup steps, then cosine decay to --lr / 10."""
    if step <= args.warmup:
        return args.lr * step / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def build(args, task, group):
    config = GPTConfig(vocab_size=task.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, d_model=args.d_model)
    mt.manual_seed(args.seed)
    gpt = GPT(config, dtype=np.dtype(args.dtype))
    model = HybridGPT(gpt, Mesh(args.dp, args.tp, args.pp, world=group), microbatches=args.microbatches,
                      schedule=args.schedule, chunks=args.chunks, sequence_parallel=args.sequence_parallel,
                      checkpoint_activations=args.checkpoint_activations, zero=args.zero, seed=args.seed)
    model.configure_optimizer(lr=args.lr, weight_decay=args.weight_decay)
    return model


def say(group, text):
    if group.rank == 0 and text:
        print(text, flush=True)


def train(args):
    """Train on this rank; returns {"losses", "metric", "check"} (metric and check on rank 0)."""
    group = world()
    task = make_task(args)
    model = build(args, task, group)
    checker = SingleDeviceCheck(model.config, args) if args.check and group.rank == 0 else None
    first = 1
    if args.resume:
        from ..checkpoint import load_checkpoint
        first = load_checkpoint(args.resume, model)["step"] + 1
    say(group, report.startup_summary(args, model, group))
    if first > 1:
        say(group, f"resumed from {args.resume} after step {first - 1}")
    losses, step_stats, check_lines = [], {}, []
    tokens = args.batch * args.block_size * args.accumulate
    start = time.perf_counter()
    for step in range(first, args.steps + 1):
        lr = learning_rate(args, step)
        model.optimizer.defaults["lr"] = lr
        batches = [global_batch(task, args, step, k) for k in range(args.accumulate)]
        model.reset_communication_stats()
        loss = float(np.mean([model.train_step(idx, targets) for idx, targets in batches]))
        model.finish_grad_sync()
        sync_stats = model.communication_stats()
        if args.check and step < first + args.check:
            check_step(model, checker, batches, loss, step, lr, group)
        model.reset_communication_stats()
        model.optimizer_step()
        step_stats = report.merge_stats(sync_stats, model.communication_stats())
        losses.append(loss)
        elapsed = time.perf_counter() - start
        if step % args.log_every == 0 or step == args.steps:
            say(group, report.progress_line(step, args.steps, loss, tokens * (step - first + 1), elapsed,
                                            step - first + 1))
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            say(group, final_metric(model, task, group, f"step {step}: "))
        if args.save and ((args.save_every and step % args.save_every == 0) or step == args.steps):
            from ..checkpoint import save_checkpoint
            save_checkpoint(args.save, model, step=step, extra={"args": vars(args)})
    return finish(args, model, task, group, losses, step_stats, checker, time.perf_counter() - start)


def check_step(model, checker, batches, loss, step, lr, group):
    grads = model.full_grads()  # collective: every rank gathers, rank 0 compares
    if checker is None:
        return
    loss_diff, grad_diff, name = checker.compare(batches, loss, grads)
    checker.step(lr)
    say(group, f"check step {step}: loss {loss:.10f}, relative loss difference {loss_diff:.1e}, largest relative "
               f"gradient difference {grad_diff:.1e} ({name}) vs one device")
    if max(loss_diff, grad_diff) > TOLERANCE:
        raise AssertionError(f"--check failed at step {step}: difference {max(loss_diff, grad_diff):.2e} "
                             f"> {TOLERANCE:g} ({name})")


def final_metric(model, task, group, prefix=""):
    dense = model.dense_gpt()  # collective: the gathered single-device model, evaluated on rank 0
    if group.rank != 0:
        return None
    name, value = evaluate(dense, task)
    return f"{prefix}{name}: {value:.4f}"


def finish(args, model, task, group, losses, step_stats, checker, seconds):
    dense = model.dense_gpt()
    result = {"losses": losses, "metric": None, "check": None}
    if group.rank == 0:
        name, value = evaluate(dense, task)
        result["metric"] = value
        print(f"trained {len(losses)} steps in {report.clock(seconds)} ({seconds:.1f} s)", flush=True)
        print(f"{name}: {value:.4f}" + (f" ({value:.1%})" if name.endswith("exact match") else ""), flush=True)
        print("sample:\n" + sample(dense, task), flush=True)
        if checker is not None:
            result["check"] = checker.worst
            print(f"check: largest relative difference to one device over {min(args.check, len(losses))} "
                  f"step(s): {checker.worst:.1e} (tolerance {TOLERANCE:g} in float64)", flush=True)
    say(group, report.communication_table(step_stats, group))
    if args.trace:
        report.save_trace(model, group, args.trace)
        say(group, f"wrote the Chrome trace of the last step on all {group.size} ranks to {args.trace} "
                   f"(open it in https://ui.perfetto.dev)")
    return result
