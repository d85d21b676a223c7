"""Chapter 2, part 2: train the GPT on the built-in addition task and watch the loss fall.

    python tutorials/02_gpt/train_addition.py [--steps 1000 --digits 2 --d-model 128]

Each problem is "a+b=" followed by the sum written least-significant digit
first; the loss counts only the answer characters. Prints the loss as a bar
every few steps, then a few held-out problems answered greedily and the
held-out exact-match rate.

The defaults are `minitensor.data.recommended_config()`, the recipe of the main job
(`python -m parallel.train`): it reaches 100% held-out exact match (seeds 0-3).
"""
import argparse
import math
import time

import numpy as np

import minitensor as mt
from minitensor.allocator import keep_freed_memory
from minitensor.data import AdditionTask, exact_match, recommended_config
from minitensor.data.addition import greedy_answers
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW


def learning_rate(step, steps, peak, warmup):
    """At step 1..steps: linear warm-up to `peak` (Adam's early steps are noisy without it), times a cosine
    down to 0 at the last step: the schedule of `python -m parallel.train`."""
    return peak * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))


def show_answers(model, task, count=6):
    """A few held-out problems, the true sum and the model's greedy answer."""
    a, b = task.problems(count, "heldout", np.random.default_rng(1))
    seq = task.sequences(a, b)
    answers = greedy_answers(model.eval(), seq[:, :task.prompt_length], task.answer_length)
    model.train()
    for x, y, answer in zip(a, b, answers):
        said = int(task.decode(answer[::-1]))  # written least-significant digit first
        print(f"  {x:>{task.digits}} + {y:>{task.digits}} = {x + y:>{task.digits + 1}}   "
              f"model says {said:>{task.digits + 1}}   {'right' if said == x + y else 'wrong'}")


def main(args):
    task = AdditionTask(digits=args.digits, seed=args.seed)
    cfg = GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, d_model=args.d_model)
    mt.manual_seed(args.seed)
    model = GPT(cfg)
    optimizer = AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    example = task.decode(task.sequences(*task.problems(1, generator=np.random.default_rng(0)))[0])  # the whole problem: inputs are all but its last character
    print(f"task: {args.digits}-digit addition, e.g. {example!r} = {example[:task.prompt_length]!r} + "
          f"the answer reversed; {cfg.vocab_size} tokens, inputs of {cfg.block_size}")
    print(f"model: {sum(p.size for p in model.parameters()):,} parameters; AdamW lr {args.lr}, "
          f"weight decay {args.weight_decay} "
          f"(warm-up {args.warmup} steps, cosine to 0); batch {args.batch}\n")

    losses, start = [], time.perf_counter()
    every = max(1, args.steps // 15)
    for step in range(args.steps):
        optimizer.defaults["lr"] = learning_rate(step + 1, args.steps, args.lr, args.warmup)
        # step t's batch from (seed, t), t counted from 1, as the main job draws it: the same problems.
        # (Another stream is another run: one, from (seed, t − 1), ended at 12% held-out.)
        idx, targets = task.get_batch(args.batch, generator=np.random.default_rng([args.seed, step + 1, 0]))
        optimizer.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}  " + "#" * round(20 * losses[-1]))
    seconds = time.perf_counter() - start
    window = max(1, min(20, args.steps // 5))
    print(f"\n{args.steps} steps in {seconds:.1f} s")
    print(f"first loss: {losses[0]:.4f} (uniform guessing over {cfg.vocab_size} tokens: ln {cfg.vocab_size} = "
          f"{np.log(cfg.vocab_size):.4f})")
    print(f"mean loss of the last {window} steps: {np.mean(losses[-window:]):.4f}")
    print("\nheld-out problems (never in a training batch), greedy decoding:")
    show_answers(model, task)
    matched = exact_match(model, task, num_problems=200)
    print(f"held-out exact match on 200 problems: {matched:.3f}")
    return losses, matched  # what tutorials/pictures/ draws


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    recipe = recommended_config()
    for flag in ("steps", "digits", "n_layer", "n_head", "d_model", "lr", "warmup", "weight_decay", "seed"):
        parser.add_argument("--" + flag.replace("_", "-"), type=type(recipe[flag]), default=recipe[flag])
    parser.add_argument("--batch", type=int, default=recipe["batch_size"])
    args = parser.parse_args()
    keep_freed_memory()  # each step's arrays are reused, not handed back to the OS and faulted in again
    main(args)
