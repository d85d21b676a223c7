"""What a mixture of experts composes with: the one answer `python -m parallel.train`'s flag
checks and the planner (`python -m parallel.plan --experts`) both give, in the trainer's flag names."""


def moe_block_problem(n_layer, moe_every):
    """Blocks M-1, 2M-1, ... are MoE (GPTConfig.is_moe): n_layer // M of them, none when M > n_layer."""
    if moe_every > n_layer:
        return (f"--moe-every {moe_every} with --n-layer {n_layer} places no MoE block (blocks M-1, 2M-1, ... are "
                f"MoE), so the model would be the dense GPT: give --moe-every at most {n_layer}")
    return None


def expert_composition_problem(n_experts, *, precision=None, local_steps=None, compress="none",
                               async_staleness=None, model="gpt"):
    """Why --experts E cannot run with these settings (one line), or None. local_steps and
    async_staleness are None when off; precision is the trainer's --precision name."""
    flag = f"--experts {n_experts}"
    if precision in ("fp16", "bf16"):  # measured: fp16 under --tp 2 routed a token elsewhere at step 1
        return (f"{flag} with --precision {precision}: routing is a discrete choice, and 16-bit rounding that "
                f"differs between layouts sends a token to another expert, so no tolerance compares the layout "
                f"with one device; train experts in float32 or float64")
    others = ["--model bert" if model == "bert" else None,
              f"--compress {compress}" if compress != "none" else None,
              f"--local-steps {local_steps}" if local_steps is not None else None,
              f"--async-staleness {async_staleness}" if async_staleness is not None else None]
    others = [o for o in others if o]
    if others:
        return (f"{flag} does not combine with {others[0]} yet: a mixture of experts runs over --dp x --ep with "
                f"--tp, --pp (any schedule), --cp, --zero 1/2/3, --recompute-activations, --link, --trace, --save "
                f"and --resume")
    return None
