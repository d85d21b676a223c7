"""The rest of Narayanan et al. 2021 (arXiv:2104.04473): its Table 2, the cluster model's one calibration,
and its sweeps, held out.

Table 2 is where the a100-80gb profile's gemm_efficiency comes from: `fitted_gemm_efficiency` finds the
value at which the model's mean error over its six runs is zero (0.70; the microbenchmark ceiling is
0.86). Nothing else was fitted, on Table 2 or anywhere: the sweeps, Table 1 and Korthikanti et al.'s
Table 5 (published.py) judge the model out of sample.

TABLE_2, numbers: the paper's Table 2 ("Comparison of PTD Parallelism to ZeRO-3"), its PTD-P rows: the
GPT-3 model (174.6B: 96 layers, 96 heads, hidden 12288, the shape sec. 5.3.2 gives) at batch 1536 and
the 529.6B model of Table 1 at batch 2240, each on three GPU counts, micro-batch 1, in achieved TFLOP/s
per GPU (the same code and cluster as Table 1). The table gives the model-parallel size only (96 and
280); t = 8 is inferred from the paper's rule (tensor parallelism up to the GPUs of a server, sec. 3.2's
Takeaway #1; sec. 4.1: "For large enough models, we use a tensor-model-parallel size of 8"), so p = 12
and 35 (35 as in Table 1's 530B row). Its last column
cross-checks the throughputs: the training days it prints follow from them by the paper's eq. 4
(8·T·P / (n·X), T = 300B tokens) within 3%, the slack of eq. 4's approximation. Read from a text
transcription of the paper's PDF (the table is an image in the arXiv HTML).

SWEEPS, orderings only: sec. 5.3.2 and 5.4's figures. Their layouts are the authors' run scripts
(NVIDIA/Megatron-LM examples/sc21/run_figure_12.sh ... run_figure_15.sh, commit
de7dc40f883ceed06344051c3c7ebd57da59cc53, "scripts for sc21", Aug 2021): each gives the shape, t, p
(d = GPUs / (t·p)), the micro-batch b (1 in all four), --DDP-impl local, full recomputation, the
batch sizes, and the interleaving (only Fig. 12's, --num-layers-per-virtual-pipeline-stage 2, so
v = 96 / (12·2) = 4; elsewhere v = 1). Their throughputs are plotted, not printed, so the values below
were read by eye from the figures and are used ONLY for which layout is faster — never for an error.
Each names the text that states the ordering where there is one.

  Fig. 13  162.2B GPT (32 layers, 128 heads, hidden 20480), 64 GPUs, batch 32 and 128, (t, p) with
           t·p = 64, b = 1, v = 1. Text: "we see peak performance when the tensor-parallel size is equal
           to the number of GPUs in a single node (8 with DGX A100 nodes)". By eye, TFLOP/s per GPU for
           t = 8, 4, 2: batch 32: ~140, ~111, ~91; batch 128: ~165, ~162, ~148. (t = 16 and 32 span
           servers, which the planner does not model; both were slower than t = 8.)
  Fig. 14  5.9B GPT (32 layers, 32 heads, hidden 3840), 64 GPUs, b = 1, v = 1, t = 1, (p, d) with
           p·d = 64, batch 32 and 512 (the script's and the legend's two; the caption says three). Text:
           "for each batch size, the throughput decreases as the pipeline-parallel size increases". By
           eye for p = 2 … 32: ~62, 56, 53, 49, 43 (batch 32); ~148, 141, 129, 114, 90 (batch 512).
  Fig. 15  the same 5.9B GPT, b = 1, p = 1, (t, d) with t·d = 64, batch 32, 128 and 512. Text: tensor
           parallelism's all-reduces dominate and "as the tensor-model-parallel size increases, we
           perform smaller matrix multiplications on every GPU". By eye for t = 2, 4, 8: ~103, 88, 70
           (batch 128); ~127, 104, 75 (512); batch 32 (~56, 54, 55) is a tie by eye and not checked.
  Fig. 12  GPT-3 175B (96 layers, 96 heads, hidden 12288) on 96 GPUs, t = 8, p = 12, d = 1 (the
           script's; the previous inference from the paper's rule agreed), b = 1, batch 12 … 60,
           non-interleaved (v = 1) against interleaved (v = 4). Text: the interleaved schedule "has
           higher computational performance" and "this gap closes as the batch size increases". By eye:
           non-interleaved ~82, 109, 122, 130, 135; interleaved ~119, 134, 141, 143, 146.
  Fig. 16 (91B, micro-batch sizes) is not used: the paper does not give that model's shape.

    python -m parallel.plan --validate-published
"""
import statistics

from minitensor.models.gpt import GPTConfig

from .cluster_search import best_steps

SEQ, VOCAB = 2048, 51200
CITATION_2 = ("Narayanan et al. 2021 (arXiv:2104.04473), Table 2, PTD-P rows (the calibration: gemm_efficiency "
              "is fitted to a zero mean error here; t = 8 inferred from the model-parallel size)")
TABLE_2 = [  # (params B, heads, hidden, layers, t, p, GPUs, batch, micro-batch, TFLOP/s per GPU)
    (174.6, 96, 12288, 96, 8, 12, 384, 1536, 1, 153),
    (174.6, 96, 12288, 96, 8, 12, 768, 1536, 1, 149),
    (174.6, 96, 12288, 96, 8, 12, 1536, 1536, 1, 141),
    (529.6, 128, 20480, 105, 8, 35, 560, 2240, 1, 171),
    (529.6, 128, 20480, 105, 8, 35, 1120, 2240, 1, 167),
    (529.6, 128, 20480, 105, 8, 35, 2240, 2240, 1, 159),
]
TABLE_2_DAYS = [84, 43, 23, 156, 80, 42]  # its last column: days to train on 300B tokens, for the cross-check

# (figure, (heads, hidden, layers), GPUs, batch, micro-batch, layouts as (t, p, v) fastest first as published);
# every b and v as the run scripts set them
GPT_162B, GPT_5B, GPT_175B = (128, 20480, 32), (32, 3840, 32), (96, 12288, 96)
SWEEPS = (
    [("Fig. 13", GPT_162B, 64, batch, 1, [(8, 8, 1), (4, 16, 1), (2, 32, 1)]) for batch in (32, 128)]
    + [("Fig. 14", GPT_5B, 64, batch, 1, [(1, p, 1) for p in (2, 4, 8, 16, 32)]) for batch in (32, 512)]
    + [("Fig. 15", GPT_5B, 64, batch, 1, [(t, 1, 1) for t in (2, 4, 8)]) for batch in (128, 512)]
    + [("Fig. 12", GPT_175B, 96, batch, 1, [(8, 12, 4), (8, 12, 1)]) for batch in (12, 24, 36, 48, 60)]
)


def config_of(heads, hidden, layers):
    """The GPT of a published run (every table and figure of both papers: sequence 2048, vocabulary 51,200)."""
    return GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=layers, n_head=heads, d_model=hidden)


def fastest(config, profile, gpus, batch, t, p, b=None, v=None):
    """The planner's fastest fitting step of (t, p) on `gpus` (b, v: given, or its best), or None. Megatron's
    own DDP, as every figure script ran (--DDP-impl local)."""
    steps = best_steps(config, profile, gpus, batch, tp=t, pp=p, b=b, v=v, ddp="local")
    fitting = [st for st in steps if st.fits]
    return fitting[0] if fitting else None


def check_sweep(sweep, profile):
    """{figure, batch, steps (one per layout, published order), agrees: the predicted order is the published}."""
    figure, shape, gpus, batch, b, layouts = sweep
    config = config_of(*shape)
    steps = [fastest(config, profile, gpus, batch, t, p, b, v) for t, p, v in layouts]
    rates = [st.tflops if st else 0.0 for st in steps]
    return {"figure": figure, "batch": batch, "layouts": layouts, "steps": steps,
            "agrees": all(st is not None for st in steps) and all(x > y for x, y in zip(rates, rates[1:]))}


def gap_closes(results):
    """Fig. 12's second claim: the interleaved/non-interleaved ratio falls as the batch grows."""
    ratios = [r["steps"][0].tflops / r["steps"][1].tflops for r in results if r["figure"] == "Fig. 12"]
    return all(x > y for x, y in zip(ratios, ratios[1:])), ratios


def layout_text(layout, st):
    t, p, v = layout
    return f"t={t} p={p} v={v}: " + (f"{st.tflops:.0f}" if st else "does not fit")


def validate_sweeps(profile, out=print):
    """Print each sweep's layouts in the published order (fastest first) with the planner's TFLOP/s per GPU."""
    out("Narayanan et al. 2021, Figs. 12-15 (held out): the planner's TFLOP/s per GPU, layouts listed fastest "
        "first as published, b = 1 and v as in the run scripts (orderings only: the figures' values are read by eye)")
    results = [check_sweep(sweep, profile) for sweep in SWEEPS]
    for r in results:
        out(f"  {r['figure']} batch {r['batch']:>4}  {'agrees   ' if r['agrees'] else 'DISAGREES'}  "
            + " > ".join(layout_text(layout, st) for layout, st in zip(r["layouts"], r["steps"])))
    closes, ratios = gap_closes(results)
    out(f"  Fig. 12 the interleaved gain shrinks with the batch: {' > '.join(f'{x:.2f}x' for x in ratios)} "
        f"({'agrees' if closes else 'DISAGREES'})")
    out(f"orderings as published: {sum(r['agrees'] for r in results) + closes} of {len(results) + 1}")
    return results


def validate_table_2(profile, out=print, goal=0.15):
    """Print Table 2's PTD-P rows against the planner (its best v at the published t, p, b); return the results."""
    out(f"{CITATION_2}; seq {SEQ}, vocab {VOCAB}, device {profile['name']}; v: the planner's best")
    out(f"{'params':>8} {'t':>2} {'p':>3} {'dp':>3} {'GPUs':>5} {'batch':>5} {'b':>3} {'v':>3} {'published':>10} "
        f"{'predicted':>10} {'error':>7}")
    results = []
    for row in TABLE_2:
        _, heads, hidden, layers, t, p, gpus, batch, b, published = row
        st = fastest(config_of(heads, hidden, layers), profile, gpus, batch, t, p, b)
        error = st.tflops / published - 1
        out(f"{row[0]:>7}B {t:>2} {p:>3} {st.dp:>3} {gpus:>5} {batch:>5} {b:>3} {st.chunks:>3} {published:>10} "
            f"{st.tflops:>10.1f} {error:>+7.1%}")
        results.append({"row": row, "step": st, "published": published, "predicted": st.tflops, "error": error})
    worst = max(abs(r["error"]) for r in results)
    within = sum(abs(r["error"]) <= goal for r in results)
    out(f"largest error {worst:.1%}; within {goal:.0%}: {within} of {len(results)}")
    return results


def fitted_gemm_efficiency(profile, low=0.5, high=1.0, halvings=12):
    """The GEMM efficiency at which the model's mean error over Table 2 is zero, by bisection (the
    predicted throughput rises with it): the fit behind the a100-80gb profile's value."""
    def mean_error(efficiency):
        trial = {**profile, "cluster": {**profile["cluster"], "gemm_efficiency": efficiency}}
        return statistics.mean(r["error"] for r in validate_table_2(trial, out=lambda line: None))
    for _ in range(halvings):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_error(middle) < 0 else (low, middle)
    return (low + high) / 2
