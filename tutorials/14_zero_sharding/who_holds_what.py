"""Chapter 14, part 1: ZeRO stages 0 → 3 — who holds what, measured against the formula.

    python tutorials/14_zero_sharding/who_holds_what.py --threads 4
    mpiexec -n 4 python -m mpi4py tutorials/14_zero_sharding/who_holds_what.py

Trains the same float64 GPT under data parallelism with each ZeRO stage (0 is plain
DP) for a few AdamW steps and prints, per stage: which rank holds which chunk of each
unit, the bytes every rank holds by kind as bars (measured from the live arrays, the
formula of Rajbhandari et al. 2020 beside), the bytes communicated per step against
the formula, and the largest difference from one device. Last, stage 3 under a 16-bit
policy (float32 GPT, fp16 compute): the chunks hold the float32 masters, and the step is
ZeRO-0's under the same policy.
"""
import parallel
import numpy as np

import minitensor as mt
from minitensor.models.gpt import GPT, GPTConfig
from minitensor.optim import AdamW
from parallel.plan import param_bytes_per_rank
from parallel.plan.model import unit_param_counts

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=32)
KINDS = ("params", "grads", "optim")
LR = 1e-2


def fresh_gpt(dtype=np.float64):
    mt.manual_seed(0)
    return GPT(CONFIG, dtype=np.dtype(dtype))


def batches(steps, size):
    rng = np.random.default_rng(1)
    return [rng.integers(0, CONFIG.vocab_size, (size, CONFIG.block_size)) for _ in range(steps)]


def one_device(data):
    model = fresh_gpt()
    optimizer = AdamW(model.parameters(), lr=LR)
    for idx in data:
        optimizer.zero_grad()
        model(idx, np.roll(idx, -1, axis=1))[1].backward()
        optimizer.step()
    return model.state_dict()


def train(group, stage, data, precision=None):
    """(bytes held after the last sync, dp bytes per step, parameters after the steps, model);
    with a precision policy the GPT is built in float32, its master dtype."""
    gpt = fresh_gpt(np.float64 if precision is None else np.float32)
    model = parallel.HybridGPT(gpt, parallel.Mesh(group.size, 1, 1, world=group), zero=stage, precision=precision,
                               scaler=dict(init_scale=2.0**8))
    model.configure_optimizer(lr=LR)
    for idx in data:
        model.reset_communication_stats()
        model.train_step(idx, np.roll(idx, -1, axis=1))
        model.finish_grad_sync()
        held = model.memory_bytes()
        model.optimizer_step()
    held["optim"] = model.memory_bytes()["optim"]  # AdamW makes its states in the first step
    comm = sum(c["bytes"] for (name, _), c in model.communication_stats().items() if name == "dp")
    return held, comm, model.full_state_dict(), model


def chunks(model, group):
    """'unit: rank r [lo, hi) ...' of this rank's ZeRO-2/3 chunks (the first few units)."""
    lines = []
    for bucket in model.replicas.buckets[::-1][:3]:
        names = [name for name, p in model.named_parameters() if any(p is q for q in bucket.params)]
        unit = names[0].rsplit(".", 2)[0] if names[0].startswith("blocks.") else names[0].split(".")[0]
        size = bucket.shard_size
        spans = ", ".join(f"rank {r} [{r * size:,}, {min((r + 1) * size, bucket.numel):,})" for r in range(group.size))
        lines.append(f"    {unit:<10} {bucket.numel:>7,} elements: {spans}")
    return lines


def bar(nbytes, largest, width=32):
    return "#" * max(1, round(width * nbytes / largest)) if nbytes else ""


def print_bars(everyone, formula, largest, n):
    for column, kind in enumerate(KINDS):
        for r in range(n):
            print(f"  {kind:<6} rank {r} {bar(everyone[r, column], largest):<32} {everyone[r, column]:>9,} B")
        print(f"  {kind:<6} formula {formula[kind]:,} B; every rank equal to it: "
              f"{all(everyone[r, column] == formula[kind] for r in range(n))}")


def sixteen_bit(group, data):
    """Stage 3 and plain DP under fp16: (every rank's bytes by kind, the largest difference)."""
    held, _, sharded, _ = train(group, 3, data, "fp16")
    _, _, plain, _ = train(group, 0, data, "fp16")
    worst = max(float(np.abs(sharded[k] - plain[k]).max()) for k in plain)
    return group.all_gather(np.array([[held[k] for k in KINDS]])), worst


def main(args):
    group = parallel.world()
    n = group.size
    data = batches(args.steps, 2 * n)
    reference = one_device(data)
    units = unit_param_counts(CONFIG)
    results = {}
    for stage in range(4):
        held, comm, params, model = train(group, stage, data)
        worst = max(float(np.abs(params[k] - reference[k]).max() / max(1.0, np.abs(reference[k]).max()))
                    for k in reference)
        everyone = group.all_gather(np.array([[held[k] for k in KINDS]]))
        results[stage] = (everyone, comm, worst, chunks(model, group) if stage > 1 else [])
    mixed, mixed_worst = sixteen_bit(group, data)
    if group.rank != 0:
        return
    print(parallel.launch.launch_report(group))
    psi = sum(units)
    print(f"GPT of Ψ = {psi:,} float64 parameters in {len(units)} units (tok_emb, pos_emb, 2 blocks, ln_f, lm_head); "
          f"AdamW: K = 2 states per parameter; {n} dp ranks\n")
    largest = max(r[0].max() for r in results.values())
    for stage, (everyone, comm, worst, spans) in results.items():
        formula = param_bytes_per_rank(CONFIG, n, 1, 1, (0, 0, 0), "float64", stage)
        title = ["plain data parallelism", "ZeRO-1: states sharded", "ZeRO-2: + gradients sharded",
                 "ZeRO-3: + parameters sharded"][stage]
        print(f"stage {stage} ({title})")
        print_bars(everyone, formula, largest, n)
        for line in spans:
            print(line)
        moved = 3 if stage == 3 else 2
        padded = {0: psi, 1: -(-psi // n) * n}.get(stage, sum(-(-u // n) * n for u in units))
        expected = moved * (n - 1) * padded * 8 // n + 2 * (n - 1) * 8 // n  # + the loss's all-reduce
        print(f"  dp bytes per step on rank 0: {comm:,} (formula {moved}Ψ(n-1)/n + the loss: {expected:,})")
        print(f"  largest parameter difference after {args.steps} steps vs one device: {worst:.1e}\n")
    static = {s: int(r[0][0].sum()) for s, r in results.items()}
    print("bytes per rank, stage 0 → 3: " + " → ".join(f"{static[s]:,}" for s in range(4))
          + f"  (stage 3 saves {static[0] / static[3]:.2f}x on {n} ranks)")
    chunk = sum(-(-u // n) for u in units)  # elements of every unit's chunk on one rank
    print("\nstage 3 under fp16 (float32 GPT: 16-bit compute chunks, float32 master chunks and moments, "
          "gradients reduce-scattered in float32)")
    print_bars(mixed, param_bytes_per_rank(CONFIG, n, 1, 1, (0, 0, 0), "fp16", 3), largest, n)
    print(f"  per rank: (2 + 4 + 12) B x {chunk:,} chunk elements = {18 * chunk:,} B; "
          f"measured {int(mixed[0].sum()):,} B")
    print(f"  largest parameter difference after {args.steps} steps vs ZeRO-0 under fp16: {mixed_worst:.1e}")


if __name__ == "__main__":
    parser = parallel.launch.rank_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    args = parser.parse_args()
    parallel.comm.run_on_ranks(args.threads, main, args)
