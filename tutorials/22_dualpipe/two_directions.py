"""Chapter 22, part 2: the bidirectional DualPipe, simulated and run for real.

    python tutorials/22_dualpipe/two_directions.py --threads 2
    mpiexec -n 2 python -m mpi4py tutorials/22_dualpipe/two_directions.py

Prints: the checker's simulated timeline of DualPipe on 8 ranks (8 stages, each held twice: rank r
holds stage r of the pipeline down the ranks and the mirrored copy of stage 7-r of the one up),
m = 20 micro-batches (0-9 down, 10-19 up), F = B = W = 1 per stage, beside DualPipeV holding the
same 8 stages on 4 ranks; each rank's idle time next to DeepSeek-V3's formula and the peak stored
graphs per rank. Then a real DualPipe step on this run's ranks (an even number): each copy's
gradient alone against one device, the copies summed, and the parameters each rank holds.
"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # ranks share the cores: one BLAS thread each (before numpy loads)

import numpy as np

import parallel  # first: it sets one BLAS thread per rank under mpiexec
import minitensor as mt
from minitensor.models import GPT
from parallel import HybridGPT, Mesh
from parallel.comm import run_on_ranks
from parallel.launch import rank_arguments
from v_timeline import CONFIG, STAGES, one_device_step, simulated  # chapter 22's first script

SIM_M = 20


def simulate(say):
    """Print the two simulated timelines; return them as [(title, Timeline)] (tutorials/pictures/)."""
    say(f"simulated: {STAGES} stages, m = {SIM_M} micro-batches, F = B = W = 1 per stage")
    formula = (STAGES // 2 - 1) * (3 + 2 - 3)  # F&B = F + B on a CPU
    return [simulated(say, "dualpipe", STAGES, SIM_M, work=3 * SIM_M, formula=formula,  # m/2 on each of two chunks
                      what=f"chunk a: micro-batches 0-{SIM_M // 2 - 1} down the ranks, b: {SIM_M // 2}-{SIM_M - 1} up"),
            simulated(say, "dualpipev", STAGES // 2, SIM_M, work=2 * 3 * SIM_M, formula=formula,
                      what="chunk a down the ranks, b back up")]


def relative(pairs):
    """|a - b| / |b| over all the (a, b) arrays together (a parameter whose gradient is 0, such as a
    key bias under softmax, has nothing to be relative to on its own)."""
    return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in pairs) / sum(np.sum(b ** 2) for _, b in pairs)))


def main():
    group = parallel.world()
    say = print if group.rank == 0 else (lambda *args: None)
    simulate(say)

    p = group.size
    m, idx, targets, gpt, ref_loss = one_device_step(p)
    ref = {n: q.grad for n, q in gpt.named_parameters()}
    mt.manual_seed(0)
    model = HybridGPT(GPT(CONFIG).double(), Mesh(1, 1, p), microbatches=m, schedule="dualpipe", chunks=2)
    loss = model.train_step(idx, targets)
    # before the sync: each copy holds the gradient of its direction's half of the micro-batches only
    alone = [relative([(q.grad, ref[n]) for n, q in stage.named_parameters()]) for stage in model.stages]
    copies = group.all_gather(np.array([[s.stage, d] for s, d in zip(model.stages, alone)], dtype=np.float64))
    grads = model.full_grads()  # finishes the sync: the two copies' gradients summed over pp ranks r and p-1-r
    diff = relative([(grads[n], ref[n]) for n in ref])
    held = group.all_gather(np.array([sum(q.size for q in model.parameters())], dtype=np.int64))
    say(f"\nreal dualpipe step on p = {p} ranks, {p} stages held twice, m = {m} ({m // 2} each way), float64:")
    for rank, rows in enumerate(copies.reshape(p, 2, 2)):
        for chunk, (stage, d) in enumerate(rows):
            say(f"  rank {rank}, chunk {'ab'[chunk]} (stage {int(stage)}, {('down', 'up')[chunk]}): "
                f"its gradient alone is off one device's by {d:.2f} (relative)")
    say(f"  copies summed: loss difference {abs(loss - ref_loss.item()):.1e}, "
        f"relative gradient difference {diff:.1e}")
    say(f"  parameters per rank {held.tolist()}; one device {gpt.num_parameters():,}: "
        f"2/p of the model per rank, twice 1F1B's 1/p")


if __name__ == "__main__":
    parser = rank_arguments(__doc__.split("\n")[0], default_threads=2)
    args = parser.parse_args()
    run_on_ranks(args.threads, main)
