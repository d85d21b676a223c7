"""Checkpoint worker: train, save, or resume and continue; rank 0 prints one JSON line per step.

    [mpiexec -n N python -m mpi4py] ckpt_train.py DIR dp,tp,pp [--zero [STAGE]] --steps N
        [--save-at K] [--resume] [--hang-after-save] [--local-steps H]

--save-at K saves after step K (then prints "saved K"); --hang-after-save then sleeps
until killed (the test kills it with SIGKILL); --resume loads DIR first and trains from
its step to N; --local-steps H trains local SGD / DiLoCo (default outer
optimizer). Lines: {"step": s, "loss": float.hex(loss)} (hex: compared bitwise).
"""
import argparse
import json
import time

import parallel
from ckpt_common import hybrid, train
from parallel.checkpoint import load_checkpoint, save_checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("layout")
parser.add_argument("--zero", type=int, nargs="?", const=1, default=0)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--save-at", type=int)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--hang-after-save", action="store_true")
parser.add_argument("--local-steps", type=int)
args = parser.parse_args()

dp, tp, pp = map(int, args.layout.split(","))
model = hybrid(dp, tp, pp, zero=args.zero)
if args.local_steps:
    model.configure_local_sgd(args.local_steps)
rank = parallel.world().rank
start = load_checkpoint(args.dir, model)["step"] if args.resume else 0
for step in range(start, args.steps):
    (loss,) = train(model, [step])
    if rank == 0:
        print(json.dumps({"step": step, "loss": loss.hex()}), flush=True)
    if step + 1 == args.save_at:
        save_checkpoint(args.dir, model, step=step + 1)
        if rank == 0:
            print(f"saved {step + 1}", flush=True)
        if args.hang_after_save:
            time.sleep(600)
