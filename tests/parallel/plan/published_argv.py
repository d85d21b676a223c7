"""The planner's command line for a row of a published table (parallel.plan.published: params, heads,
hidden, layers, t, p, GPUs, batch, ...), shared by the cluster model's CLI tests."""
from parallel.plan.published import SEQ, VOCAB


def published_argv(row, device="a100-80gb", with_batch=True):
    """--n-layer ... --device (and --batch unless `with_batch` is False) of the row's model and run."""
    _, heads, hidden, layers, _, _, gpus, batch, *_ = row
    argv = ["--n-layer", str(layers), "--d-model", str(hidden), "--n-head", str(heads), "--vocab", str(VOCAB),
            "--seq", str(SEQ), "--devices", str(gpus), "--device", device]
    return argv + (["--batch", str(batch)] if with_batch else [])
