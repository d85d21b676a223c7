"""`python -m parallel.smaller_models prune|distill [flags]`: progress lines, then a table."""
import argparse
import sys
import time

import numpy as np

from minitensor.data import exact_match
from minitensor.flags import AT_LEAST_0, AT_LEAST_1, POSITIVE, bad_flag

from . import STUDENT, TEACHER, distill_experiment, gpt, prune_experiment, task, trained_teacher

EXAMPLES = """examples:
  python -m parallel.smaller_models prune                         # 50/75/90% magnitude + structured, fine-tuned
  python -m parallel.smaller_models prune --sparsity 0.9 --finetune-steps 100
  python -m parallel.smaller_models distill --seeds 0 1 2 --steps 800
"""


def build_parser():
    p = argparse.ArgumentParser(prog="python -m parallel.smaller_models", epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Prune or distill the 2-digit addition GPT and measure held-out exact match.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--teacher-steps", type=int, default=2000, help="training steps of the teacher (cached)")
    common.add_argument("--problems", type=int, default=1000, help="held-out problems scored")
    sub = p.add_subparsers(dest="command", required=True)
    prune = sub.add_parser("prune", parents=[common],
                           help="magnitude pruning at several sparsities, and heads/neurons removed")
    prune.add_argument("--sparsity", type=float, nargs="+", default=[0.5, 0.75, 0.9], help="shares of zeroed weights")
    prune.add_argument("--finetune-steps", type=int, default=300, help="fine-tuning steps after pruning")
    distill = sub.add_parser("distill", parents=[common], help="a student of < 1/4 the parameters, alone vs distilled")
    distill.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one student pair per seed")
    distill.add_argument("--steps", type=int, default=800, help="training steps of each student")
    distill.add_argument("--alpha", type=float, default=0.5, help="weight of the hard-label cross-entropy")
    distill.add_argument("--temperature", type=float, default=2.0, help="softening of both softmaxes")
    distill.add_argument("--student-layers", type=int, default=STUDENT["n_layer"], help="the student's blocks")
    distill.add_argument("--student-heads", type=int, default=STUDENT["n_head"], help="the student's heads")
    distill.add_argument("--student-d-model", type=int, default=STUDENT["d_model"], help="the student's width")
    return p


COMMON = {"teacher_steps": AT_LEAST_1, "problems": AT_LEAST_1}
RULES = {"prune": {**COMMON, "finetune_steps": AT_LEAST_1, "sparsity": ("in [0, 1)", lambda v: 0 <= v < 1)},
         "distill": {**COMMON, "steps": AT_LEAST_1, "seeds": AT_LEAST_0,
                     "alpha": ("in [0, 1]", lambda v: 0 <= v <= 1), "temperature": POSITIVE,
                     **dict.fromkeys(("student_layers", "student_heads", "student_d_model"), AT_LEAST_1)}}


def progress(what, step, loss):
    print(f"  {what}: step {step}  loss {loss:.4f}", flush=True)


def run_prune(args, teacher):
    rows = prune_experiment(teacher, args.sparsity, args.finetune_steps, args.problems,
                            log=lambda what, step, loss: progress(what, step, loss))
    print(f"\npruning the teacher, then {args.finetune_steps} fine-tuning steps (mask re-applied after each):")
    print(f"  {'model':<32} {'parameters':>10} {'sparsity':>9} {'exact match pruned':>19} {'fine-tuned':>11}")
    for what, kept, reached, before, after in rows:
        print(f"  {what:<32} {kept:>10,} {reached:>9.4f} {before:>19.3f} {after:>11.3f}")


def run_distill(args, teacher):
    sizes = dict(n_layer=args.student_layers, n_head=args.student_heads, d_model=args.student_d_model)
    student = gpt(sizes, 0).num_parameters()
    print(f"student: {sizes}, {student:,} parameters = {student / teacher.num_parameters():.3f} of the teacher's")
    results = distill_experiment(teacher, args.seeds, args.steps, args.problems, args.alpha, args.temperature, sizes,
                                 log=lambda what, step, loss: progress(what, step, loss))
    print(f"\nthe student, {args.steps} steps, alone vs distilled (alpha {args.alpha}, temperature {args.temperature}):")
    print(f"  {'seed':>4} {'alone':>8} {'distilled':>10}")
    for seed, (alone, taught) in results.items():
        print(f"  {seed:>4} {alone:>8.3f} {taught:>10.3f}")
    alone, taught = (float(np.median([r[i] for r in results.values()])) for i in (0, 1))
    print(f"median held-out exact match: alone {alone:.3f}, distilled {taught:.3f} "
          f"({'distillation helps' if taught > alone else 'distillation does not help here'})")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    message = bad_flag(args, RULES[args.command])
    if message:
        parser.error(message)
    start = time.perf_counter()
    print(f"teacher: {TEACHER}, 2-digit addition, {args.teacher_steps} steps (cached after the first run)", flush=True)
    teacher = trained_teacher(args.teacher_steps, log=lambda step, loss: progress("teacher", step, loss))
    print(f"teacher: {teacher.num_parameters():,} parameters, held-out exact match "
          f"{exact_match(teacher, task(), args.problems):.3f}", flush=True)
    (run_prune if args.command == "prune" else run_distill)(args, teacher)
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
