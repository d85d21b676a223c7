"""Chapter 2, part 2: train the GPT on the built-in addition task and watch the loss fall.

    python tutorials/02_gpt/train_addition.py [--steps 800 --digits 2 --d-model 64]

Each problem is "a+b=" followed by the sum written least-significant digit
first; the loss counts only the answer characters. Prints the loss as a bar
every few steps, then a few held-out problems answered greedily and the
held-out exact-match rate.
"""
import argparse
import time

import numpy as np

import minitensor as mt
from minitensor.data import AdditionTask, exact_match
from minitensor.data.addition import greedy_answers
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW


def learning_rate(step, peak, warmup):
    """Linear warm-up to `peak`, then constant: Adam's early steps are noisy without it."""
    return peak * min(1.0, (step + 1) / warmup)


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
    optimizer = AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    print(f"task: {args.digits}-digit addition, e.g. {task.decode(task.get_batch(1)[0][0])!r} -> "
          f"the answer characters; {cfg.vocab_size} tokens, sequences of {cfg.block_size}")
    print(f"model: {sum(p.size for p in model.parameters()):,} parameters; AdamW lr {args.lr} "
          f"(warm-up {args.warmup} steps); batch {args.batch}\n")

    losses, start = [], time.perf_counter()
    every = max(1, args.steps // 15)
    for step in range(args.steps):
        optimizer.defaults["lr"] = learning_rate(step, args.lr, args.warmup)
        idx, targets = task.get_batch(args.batch)
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
    print(f"held-out exact match on 200 problems: {exact_match(model, task, num_problems=200):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
