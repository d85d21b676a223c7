"""What the job trains on: the built-in addition task (for --model bert: its masked form),
or char-level text from --data.

Batch s of a run is a pure function of (seed, s), drawn alike on every rank, so every
layout sees the same global batches (and the same losses), and a resumed run continues
the very same stream.
"""
from pathlib import Path

import numpy as np

from minitensor.data import AdditionTask, CharDataset, MaskedAdditionTask, exact_match, recommended_config
from minitensor.data.addition import greedy_answers
from minitensor.data.masked_addition import MASK, masked_digit_accuracy

TEXT_DEFAULTS = dict(block_size=64, batch=32, steps=500)


def task_defaults(args):
    """Default flags: the addition task's recommended config (also for model and optimizer on --data)."""
    rec = recommended_config()
    defaults = dict(n_layer=rec["n_layer"], n_head=rec["n_head"], d_model=rec["d_model"], batch=rec["batch_size"],
                    steps=rec["steps"], lr=rec["lr"], warmup=rec["warmup"], weight_decay=rec["weight_decay"],
                    seed=rec["seed"], digits=rec["digits"])
    if args.data:
        defaults.update(TEXT_DEFAULTS)
    else:
        if args.block_size is not None:
            raise ValueError("--block-size applies to --data; the addition task's length is 3·digits + 2 "
                             "(set --digits)")
        digits = args.digits if args.digits is not None else defaults["digits"]
        defaults["block_size"] = task_class(args)(digits).block_size
    return defaults


def task_class(args):
    return MaskedAdditionTask if args.model == "bert" else AdditionTask


def make_task(args):
    if args.data:
        return CharDataset(read_text(args.data), args.block_size, seed=args.seed)
    return task_class(args)(digits=args.digits, seed=args.seed)


MAX_DATA_BYTES = 256 << 20  # char-level text for a model of this engine's size: far more than it can learn from


def read_text(path):
    """The --data file as text; a ValueError naming the flag and the file if it is not a regular
    file (/dev/zero would be read until memory runs out), is larger than MAX_DATA_BYTES, or
    cannot be read."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"--data {path} is not a regular file; give a UTF-8 text file")
    if path.is_file() and path.stat().st_size > MAX_DATA_BYTES:
        raise ValueError(f"--data {path} has {path.stat().st_size:,} bytes, more than the {MAX_DATA_BYTES >> 20} MiB "
                         f"this char-level task reads; give a smaller file (e.g. its first {MAX_DATA_BYTES >> 20} MiB)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--data {path} is not UTF-8 text: byte 0x{error.object[error.start]:02x} at offset "
                         f"{error.start} ({error.reason}); give a UTF-8 text file") from None
    except OSError as error:
        raise ValueError(f"--data {path}: {error.strerror or error}") from None


def global_batch(task, args, step, micro=0):
    """The global batch `micro` (of --accumulate) of step `step`: the same on every rank."""
    return task.get_batch(args.batch, generator=np.random.default_rng([args.seed, step, micro]))


def evaluate(model, task):
    """(name, value) of the held-out metric of a dense model."""
    if isinstance(task, MaskedAdditionTask):
        return "held-out masked-digit accuracy", masked_digit_accuracy(model, task, num_problems=1000)
    if isinstance(task, AdditionTask):
        return "held-out exact match", exact_match(model, task, num_problems=1000)
    losses = []
    for i in range(8):  # a fixed set of windows: the text has no held-out split
        idx, targets = task.get_batch(32, generator=np.random.default_rng([10**6, i]))
        losses.append(model.eval()(idx, targets)[1].item())
    return "loss on 8 fixed batches", float(np.mean(losses))


def sample(model, task, count=4):
    """A few lines of what the dense model writes."""
    model.eval()
    if isinstance(task, MaskedAdditionTask):
        return masked_samples(model, task, count)
    if isinstance(task, AdditionTask):
        a, b = task.problems(count, "heldout", np.random.default_rng(1))
        seq = task.sequences(a, b)
        answers = greedy_answers(model, seq[:, :task.prompt_length], task.answer_length)
        lines = []
        for x, y, got in zip(a, b, answers):
            text = task.decode(got)[::-1]  # answers are written least-significant digit first
            value = int(text) if text.isdigit() else text
            lines.append(f"{x} + {y} = {value}  {'ok' if value == x + y else f'(wrong: {x + y})'}")
        return "\n".join(lines)
    start = task.data[:1][None, :]
    return task.decode(model.generate(start, 200, greedy=False, generator=np.random.default_rng(0))[0])


def masked_samples(model, task, count):
    """Held-out problems with their first answer digit masked, and what the model fills in."""
    seq = task.sequences(*task.problems(count, "heldout", np.random.default_rng(1)))
    inputs = seq.copy()
    inputs[:, task.prompt_length] = MASK
    guess = model(inputs)[0].data[:, task.prompt_length].argmax(axis=-1)
    return "\n".join(f"{task.decode(row)} -> {task.vocab[g]}  {'ok' if g == s else f'(wrong: {s})'}"
                     for row, g, s in zip(inputs, guess, seq[:, task.prompt_length]))
