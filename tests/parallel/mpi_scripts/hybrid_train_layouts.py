"""Under mpiexec -n 8: `parallel.train --check` on the six layouts of the issue, one after the
other in this one job (each a full run of the CLI's main: its own Mesh, model and groups).

Each run trains two float64 steps of a tiny GPT and rank 0 compares the loss and every
gradient with the single-device model (the run raises, and the job aborts, beyond 1e-9).
Rank 0 prints "layout <dp,tp,pp> check <worst difference>" per run.
"""
import parallel
from parallel.train import main

TINY = ["--steps", "2", "--check", "2", "--d-model", "16", "--n-head", "4", "--batch", "16", "--digits", "2",
        "--log-every", "1"]
LAYOUTS = [  # (dp, tp, pp), extra switches so that each mechanism also runs on real ranks
    ((2, 2, 2), ["--microbatches", "4", "--schedule", "1f1b", "--zero"]),
    ((1, 2, 4), ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2", "--n-layer", "8",
                 "--sequence-parallel"]),
    ((4, 2, 1), ["--microbatches", "2", "--recompute-activations"]),
    ((2, 4, 1), ["--sequence-parallel", "--accumulate", "2"]),
    ((8, 1, 1), ["--microbatches", "2", "--zero"]),
    ((1, 1, 8), ["--microbatches", "8", "--schedule", "gpipe", "--n-layer", "8", "--recompute-activations"]),
]

world = parallel.world()
for (dp, tp, pp), extra in LAYOUTS:
    flags = TINY + ["--n-layer", "2"] + extra + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp)]
    result = main(flags)
    if world.rank == 0:
        assert result["check"] is not None and result["check"] <= 1e-9, result
        print(f"layout {dp},{tp},{pp} check {result['check']:.1e}", flush=True)
