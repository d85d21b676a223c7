"""Chapter 12, part 3: compression loses information; error feedback sends it later instead.

    python tutorials/12_communication/error_feedback.py --threads 2 [--steps 100]
    mpiexec -n 2 python -m mpi4py tutorials/12_communication/error_feedback.py

Trains the chapter's small GPT on the addition task three times, data parallel: with plain
all-reduce, with top-k at 1% of the entries and error feedback, and with the same top-k
WITHOUT error feedback (`TopK(ratio, error_feedback=False)`): the 99% of each gradient
that top-k drops is then lost for good. Prints the final loss and bytes per step of each.
"""
import parallel
from addition_run import train

from parallel.data_parallel.comm_hooks import TopK


def main(args):
    group = parallel.world()
    runs = [("all-reduce", None), ("top-k 1% with error feedback", TopK(0.01)),
            ("top-k 1% without error feedback", TopK(0.01, error_feedback=False))]
    results = {name: train(group, args.steps, hook) for name, hook in runs}
    if group.rank == 0:
        print(f"{args.steps} AdamW steps on {group.size} ranks; loss = mean of the last 10 steps")
        for name, (loss, nbytes, _) in results.items():
            print(f"  {name:<32} loss {loss:.4f}   bytes per step per rank {nbytes:>9,.0f}")
        with_ef = results["top-k 1% with error feedback"][0]
        without = results["top-k 1% without error feedback"][0]
        print(f"loss without error feedback minus with: {without - with_ef:.4f}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
