"""Chapter 22, part 2: when DualPipeV loses to interleaving, and why the V's rank 0 is heavy.

    python tutorials/22_dualpipe/against_interleaving.py

Prints: on p = 4 ranks, m = 16 micro-batches, each rank's idle time for the same model work
(per micro-batch and rank: forward 2 units, backward 4 of which W 2) cut into v chunks per rank
(interleaved 1F1B, v = 1, 2, 4, 8: every chunk costs 1/v of it) and into DualPipeV's two chunks
(its F&B pairs run in sequence, as on this CPU), simulated by the checker next to the formulas,
with the messages a rank sends per micro-batch. Then the blocks per stage that balance the
parameters of a GPT with a large vocabulary over 8 stages, and what that puts on each rank
under 1F1B's line and DualPipeV's V.
"""
from minitensor.models import GPT, GPTConfig
from parallel.pipeline import Timeline, balance_by_parameters, check_schedule, get_schedule, split_gpt, stage_of

P, M = 4, 16
FORWARD, BACKWARD, WEIGHT = 2.0, 4.0, 2.0  # one rank's whole share of a micro-batch


def idle(name, chunks, placement="loop"):
    """Each rank's idle time (makespan - work) and sends per micro-batch, costs split over the chunks."""
    schedule = get_schedule(name, P, M, chunks)
    report = check_schedule(schedule, P, M, chunks, forward_time=FORWARD / chunks, backward_time=BACKWARD / chunks,
                            weight_time=WEIGHT / chunks, placement=placement)
    sends = max(sum(a.kind.startswith("send") for a in actions) for actions in schedule) / M
    return Timeline(report.events, P).makespan - M * (FORWARD + BACKWARD), sends


def main():
    print(f"p = {P} ranks, m = {M}; per micro-batch and rank F = {FORWARD:g}, B = {BACKWARD:g} (W = {WEIGHT:g})")
    for v in (1, 2, 4, 8):
        time, sends = idle("interleaved", v)
        formula = (P - 1) * (FORWARD + BACKWARD) / v
        print(f"interleaved v = {v}: idle per rank {time:g} (formula (p-1)(F+B)/v = {formula:g}), "
              f"sends per micro-batch {sends:g}")
    time, sends = idle("dualpipev", 2, "v")
    f, b, w = FORWARD / 2, BACKWARD / 2, WEIGHT / 2
    print(f"dualpipev: idle per rank {time:g} (formula (p-1)(F&B+B-3W) = {(P - 1) * (f + b + b - 3 * w):g} "
          f"with F&B = F+B), sends per micro-batch {sends:g}")
    print(f"dualpipev if F&B overlapped fully (F&B = B): formula {(P - 1) * (b + b - 3 * w):g}")

    gpt = GPT(GPTConfig(vocab_size=4096, block_size=16, n_layer=16, n_head=4, d_model=64))
    balance = balance_by_parameters(gpt, 2 * P)
    print(f"\nGPT with vocab 4096, 16 blocks, 8 stages: blocks per stage balancing parameters {balance}")
    params = [stage.num_parameters() for stage in split_gpt(gpt, 2 * P, balance)]
    for placement, chunks, ranks in (("loop", 1, 2 * P), ("v", 2, P)):
        held = [[stage_of(r, c, ranks, placement) for c in range(chunks)] for r in range(ranks)]
        print(f"{'1F1B line' if placement == 'loop' else 'DualPipeV V'}: stages per rank {held}; thousand "
              f"parameters per rank {[round(sum(params[s] for s in stages) / 1000) for stages in held]}")


if __name__ == "__main__":
    main()
