"""Chapter 13, part 1: local SGD / DiLoCo — talk every H steps instead of every step.

    python tutorials/13_local_sgd_and_staleness/local_sgd.py --threads 2 [--steps 96]
    mpiexec -n 2 python -m mpi4py tutorials/13_local_sgd_and_staleness/local_sgd.py

First the identity that pins the sign down: with ONE inner SGD step, outer learning rate 1
and no momentum, averaging the pseudo-gradients Δ_i = θ − θ_i and stepping θ − Δ lands
exactly on synchronous data parallelism (printed: the largest parameter difference).
Then DiLoCo proper (AdamW inside, Nesterov SGD outside) on chapter 12's addition run with
H = 1, 4 and 16: bytes per optimizer step fall by H; compare the losses with synchronous DP.
Last, the outer step's stride at H = 4: how far the anchor moves per outer step against how
far the mean replica moved, for three outer optimizers. With momentum μ the Nesterov step
is lr_out·(Δ + μ·v) and v → Δ/(1 − μ) while the Δ keep pointing the same way, so the
stride tends to lr_out/(1 − μ): 7 for DiLoCo's (0.7, 0.9).
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "12_communication"))  # chapter 12's small run
from addition_run import CONFIG, batch_of_rank, train

import minitensor as mt
import parallel
from minitensor.models.gpt import GPT
from minitensor.optim import SGD
from parallel.data_parallel.local_sgd import DiLoCo
from parallel.data_parallel.reducer import Reducer

STRIDE_SETTINGS = [(0.7, 0.9), (0.1, 0.9), (1.0, 0.0)]  # (outer lr, outer momentum)


class StrideDiLoCo(DiLoCo):
    """DiLoCo that records each outer step's stride |θ_new − θ_old| / |mean_i Δ_i| (it
    all-reduces Δ_i once more to know the mean; the chapter's measurement only)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.strides = []

    def sync(self):
        group = self.reducer.group
        mean_delta = [group.all_reduce(a - p.data) / group.size for a, p in zip(self.anchors, self.params)]
        before = [a.copy() for a in self.anchors]
        super().sync()
        moved = [b - a for b, a in zip(before, self.anchors)]
        self.strides.append(norm(moved) / norm(mean_delta))


def norm(arrays):
    return float(np.sqrt(sum(np.sum(a.astype(np.float64) ** 2) for a in arrays)))


def sgd_run(group, steps, local):
    """Three SGD steps, either data parallel (gradients averaged) or local SGD with H = 1."""
    mt.manual_seed(0)
    model = GPT(CONFIG).double()
    params = [p for p in model.parameters() if p.requires_grad]
    reducer = Reducer(params[::-1], group)
    outer = DiLoCo(reducer, 1, outer_lr=1.0, outer_momentum=0.0) if local else None
    opt = SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        model(*batch_of_rank(group, step, seed=0))[1].backward()
        if outer is None:
            reducer.finish()  # the mean gradient
        opt.step()
        if outer is not None:
            outer.step()  # the mean of the replicas' moves
    return np.concatenate([p.data.reshape(-1) for p in params])


def main(args):
    group = parallel.world()
    dp, local = sgd_run(group, 3, local=False), sgd_run(group, 3, local=True)
    diff = group.all_reduce(np.array([np.abs(dp - local).max() / np.abs(dp).max()]), op="max")[0]
    results = {h: train(group, args.steps, local_steps=h) for h in (1, 4, 16)}
    sync_loss, sync_bytes, _ = train(group, args.steps)
    strides = {(lr, mu): train(group, args.steps, local_steps=4, outer_lr=lr, outer_momentum=mu,
                               outer_class=StrideDiLoCo) for lr, mu in STRIDE_SETTINGS}
    if group.rank == 0:
        print(f"local SGD with H = 1, outer lr 1, no momentum vs synchronous SGD, 3 steps, float64: "
              f"largest relative parameter difference {diff:.1e}")
        print(f"{args.steps} AdamW steps on {group.size} ranks; loss = mean of the last 10 steps")
        print(f"  synchronous DP        loss {sync_loss:.4f}   bytes per step per rank {sync_bytes:>9,.0f}")
        for h, (loss, nbytes, _) in results.items():
            print(f"  DiLoCo H = {h:<2}         loss {loss:.4f}   bytes per step per rank {nbytes:>9,.0f}")
        print(f"bytes per step, H = 1 / H = 16: {results[1][1] / results[16][1]:.2f}")
        print("the outer step's stride at H = 4, |θ_new − θ_old| / |mean Δ|, mean over the last 8 outer steps:")
        for (lr, mu), (loss, _, model) in strides.items():
            print(f"  outer lr {lr:.1f}, momentum {mu:.1f}: stride {np.mean(model.outer.strides[-8:]):.2f}"
                  f"  (lr/(1 − μ) = {lr / (1 - mu):.1f})   loss {loss:.4f}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=96, help="training steps (default 96, a multiple of 16)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
