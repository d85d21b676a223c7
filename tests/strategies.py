"""The suite's shared hypothesis strategies: import them from any test (`from strategies import ...`).

Append new strategies at the end of the file; do not reorder others'.
"""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# --- parallel.comm ---------------------------------------------------------------

COMM_DTYPES = (np.float32, np.float64, np.int32, np.int64)
comm_dtypes = st.sampled_from(COMM_DTYPES).map(np.dtype)
group_sizes = st.integers(1, 8)
reduce_ops = st.sampled_from(["sum", "max", "min"])
allreduce_algorithms = st.sampled_from(["builtin", "ring"])
# How a test lays an array out in memory: C order, or one of three non-contiguous views.
array_layouts = st.sampled_from(["C", "strided", "fortran", "reversed"])
seeds = st.integers(0, 2**32 - 1)


def comm_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


# --- parallel.pipeline (schedules) -----------------------------------------------

@st.composite
def pipeline_shapes(draw, schedule=None):
    """(name, p, m, v) of a valid pipeline schedule: p ranks 1..8, m micro-batches
    1..16, v chunks per rank 1..4 (interleaved only; v > 1 needs p > 1 and m % p == 0)."""
    name = schedule or draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    p = draw(st.integers(1, 8))
    if name != "interleaved" or p == 1:
        return name, p, draw(st.integers(1, 16)), 1
    return name, p, p * draw(st.integers(1, 16 // p)), draw(st.integers(1, 4))

# --- minitensor ------------------------------------------------------------------

# Shapes of 0 to 3 dims with sides 1..3: small enough for gradcheck, with size-1 dims.
small_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3)
# Two shapes that broadcast together (stretching size-1 dims and adding leading ones).
broadcastable_pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)
# Batched matmul operands (..., m, k) @ (..., k, n), batch dims broadcastable.
matmul_shapes = hnp.mutually_broadcastable_shapes(signature="(m,k),(k,n)->(m,n)", max_dims=2, max_side=3)
# Whether a test stores its input arrays transposed in memory (non-contiguous).
transposed_layouts = st.booleans()


@st.composite
def shapes_and_axes(draw, min_dims=1):
    """A shape and a reduction axis: None, one (maybe negative) axis, or a tuple of them."""
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=1, max_side=3))
    axis = draw(st.none() | hnp.valid_tuple_axes(len(shape), min_size=1)
                | st.integers(-len(shape), len(shape) - 1))
    return shape, axis

# --- parallel.tensor_parallel ----------------------------------------------------

@st.composite
def tp_gpt_layouts(draw, tps=(1, 2, 3, 4)):
    """A small GPT config (as a dict), a tp size that divides its heads, SP on/off, batch and
    sequence lengths (a multiple of tp under SP). The vocabulary is often not divisible by tp."""
    tp = draw(st.sampled_from(tps))
    sequence_parallel = draw(st.booleans())
    n_head = tp * draw(st.integers(1, 2))
    seq = tp * draw(st.integers(1, 2)) if sequence_parallel else draw(st.integers(1, 6))
    config = dict(vocab_size=draw(st.integers(2, 13)), block_size=seq + draw(st.integers(0, 2)),
                  n_layer=draw(st.integers(1, 2)), n_head=n_head, d_model=n_head * draw(st.integers(1, 3)))
    return dict(tp=tp, sequence_parallel=sequence_parallel, config=config, batch=draw(st.integers(1, 3)), seq=seq)

# --- parallel.hybrid (3D) ----------------------------------------------------------

@st.composite
def hybrid_layouts(draw, max_world=8):
    """A 3D layout (dict of HybridGPT's arguments plus dp, tp, pp with dp·tp·pp ≤ max_world)
    and what fits it: a small GPT config (dict), micro-batch size, sequence length, and
    how many global batches are accumulated per optimizer step."""
    pp = draw(st.integers(1, 4))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if t * pp <= max_world]))
    dp = draw(st.integers(1, max_world // (tp * pp)))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    chunks = 2 if schedule == "interleaved" and pp > 1 else 1
    m = pp * draw(st.integers(1, 2)) if chunks > 1 else draw(st.integers(1, 4))
    sequence_parallel = draw(st.booleans())
    layout = dict(dp=dp, tp=tp, pp=pp, microbatches=m, schedule=schedule, chunks=chunks,
                  sequence_parallel=sequence_parallel, recompute_activations=draw(st.booleans()),
                  zero=draw(st.booleans()))
    n_head = tp * draw(st.integers(1, 2))
    seq = tp * draw(st.integers(1, 2)) if sequence_parallel else draw(st.integers(1, 5))
    config = dict(vocab_size=draw(st.integers(5, 13)), block_size=seq + draw(st.integers(0, 2)),
                  n_layer=pp * chunks + draw(st.integers(0, 1)), n_head=n_head,
                  d_model=n_head * draw(st.sampled_from([2, 4])))
    return dict(layout=layout, config=config, micro_batch=draw(st.integers(1, 2)), seq=seq,
                accumulate=draw(st.integers(1, 2)))

# --- parallel.pipeline (zero-bubble schedules in 3D) -------------------------------

@st.composite
def zero_bubble_layouts(draw, max_world=8):
    """`hybrid_layouts` with one chunk per rank, m in 1..8 and a schedule among the
    zero-bubble ones and the two they are measured against."""
    drawn = draw(hybrid_layouts(max_world))
    schedule = draw(st.sampled_from(["zb-h1", "zb-h2", "1f1b", "gpipe"]))
    layout = dict(drawn["layout"], schedule=schedule, chunks=1, microbatches=draw(st.integers(1, 8)))
    return dict(drawn, layout=layout)

# --- parallel.context_parallel ---------------------------------------------------

cp_sizes = st.integers(1, 4)
cp_layouts = st.sampled_from(["zigzag", "contiguous"])


@st.composite
def ring_attention_cases(draw):
    """cp, layout, causal, and (B, heads, T, d) with T a multiple of the layout's chunk count."""
    cp, layout = draw(cp_sizes), draw(cp_layouts)
    chunks = 2 * cp if layout == "zigzag" else cp
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), chunks * draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    return dict(cp=cp, layout=layout, causal=draw(st.booleans()), shape=shape)


@st.composite
def context_parallel_layouts(draw, max_world=8):
    """A 4D layout (HybridGPT's arguments with cp ∈ 1..4, ring or Ulysses, tp and dp drawn, pp ≤ 2, world ≤ max_world,
    any one-chunk schedule: ring attention also runs inside ZB's B half and under recomputation),
    a small GPT config (dict, causal or not) and a sequence length the cp layout can cut."""
    cp, cp_layout = draw(cp_sizes), draw(cp_layouts)
    tp = draw(st.sampled_from([t for t in (1, 2) if t * cp <= max_world]))
    pp = draw(st.sampled_from([p for p in (1, 2) if p * tp * cp <= max_world]))
    dp = draw(st.sampled_from([d for d in (1, 2) if d * pp * tp * cp <= max_world]))
    sequence_parallel = tp > 1 and draw(st.booleans())
    comm_type = draw(st.sampled_from(["p2p", "a2a"]))
    chunks = 2 * cp if cp_layout == "zigzag" else cp
    seq = chunks * tp * draw(st.integers(1, 2)) if sequence_parallel else chunks * draw(st.integers(1, 2))
    layout = dict(dp=dp, tp=tp, pp=pp, cp=cp, cp_layout=cp_layout, cp_comm_type=comm_type,
                  microbatches=draw(st.integers(1, 2)),
                  schedule=draw(st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2"])), chunks=1,
                  sequence_parallel=sequence_parallel,
                  recompute_activations=draw(st.booleans()), zero=draw(st.sampled_from([0, 1, 2, 3])))
    n_head = tp * (cp if comm_type == "a2a" else 1) * draw(st.integers(1, 2))  # Ulysses splits heads over cp
    config = dict(vocab_size=draw(st.integers(5, 13)), block_size=seq + draw(st.integers(0, 2)), n_layer=pp,
                  n_head=n_head, d_model=n_head * draw(st.sampled_from([2, 4])), causal=draw(st.booleans()))
    return dict(layout=layout, config=config, micro_batch=draw(st.integers(1, 2)), seq=seq)


# --- parallel.data_parallel.fully_sharded (ZeRO stages in 3D) -------------------------------------

@st.composite
def zero_layouts(draw, max_world=8):
    """`hybrid_layouts` with dp ≥ 2 where it fits and the ZeRO stage drawn from 0..3."""
    drawn = draw(hybrid_layouts(max_world))
    layout = dict(drawn["layout"], zero=draw(st.sampled_from([0, 1, 2, 3])))
    return dict(drawn, layout=layout)


# --- parallel.comm.link and parallel.data_parallel.comm_hooks ------------------------------------

# (α seconds per message, β seconds per byte) of a simulated link, small enough to keep tests fast.
link_figures = st.tuples(st.sampled_from([0.0, 1e-6, 1e-4]), st.sampled_from([0.0, 1e-10, 1e-9]))


# --- minitensor.amp (the loss scaler) --------------------------------------------

# minitensor.narrow_moments: a parameter vector of 1..40 finite values
moment_params = st.integers(1, 40).flatmap(lambda n: st.lists(
    st.floats(-1e3, 1e3, allow_subnormal=False), min_size=n, max_size=n).map(np.array))


@st.composite
def scaler_events(draw):
    """(log2 of the initial scale 0..20, growth_interval 1..5, overflow flags of up to 30 steps)."""
    return draw(st.integers(0, 20)), draw(st.integers(1, 5)), draw(st.lists(st.booleans(), max_size=30))


# --- parallel.plan.auto (the sharding search) ------------------------------------


@st.composite
def operator_graphs(draw, max_ops=3):
    """A small random minitensor.graph.ir.Graph of 2-D values: an input, then ops (bias-free
    Linear with a new weight, Gelu, Add, Mul, a row Sum) reading earlier values; sizes 1..6 so
    some dimensions split over tp 2 or 3 and some do not. The last op and one other value are
    outputs."""
    from minitensor.graph.ir import Graph, Node
    rows, width = draw(st.sampled_from([2, 3, 4, 6])), draw(st.sampled_from([2, 3, 4, 6]))
    nodes, shapes = [Node("x", "input", shape=(rows, width))], {"x": (rows, width)}
    for i in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["Linear", "Gelu", "Add", "Mul", "Sum"]))
        a = draw(st.sampled_from(sorted(shapes)))
        shape = shapes[a]
        if op == "Linear":
            out = draw(st.sampled_from([1, 2, 3, 4, 6]))
            nodes.append(Node(f"w{i}", "param", shape=(out, shape[1])))
            inputs, shape, flops = (a, f"w{i}"), (shape[0], out), 2 * shape[0] * shape[1] * out
        elif op in ("Add", "Mul"):
            inputs = (a, draw(st.sampled_from([v for v in sorted(shapes) if shapes[v] == shape])))
            flops = shape[0] * shape[1]
        else:
            inputs, flops = (a,), shape[0] * shape[1]
        attrs = {"axis": 1, "keepdims": True} if op == "Sum" else {}
        shape = (shape[0], 1) if op == "Sum" else shape
        nodes.append(Node(f"{op.lower()}_{i}", op, inputs, shape, attrs=attrs, flops=flops))
        shapes[nodes[-1].name] = shape
    outputs = {nodes[-1].name, draw(st.sampled_from(sorted(shapes)))}
    return Graph(nodes, tuple(sorted(outputs)))


# (tp, α seconds, β seconds per byte, flop/s): regimes from compute-bound to latency-bound.
sharding_machines = st.tuples(st.sampled_from([2, 3]), st.sampled_from([0.0, 1e-7, 1e-4]),
                              st.sampled_from([0.0, 1e-10, 1e-8]), st.sampled_from([1e6, 1e9]))


# --- minitensor (the PyTorch op surface) -------------------------------------------

# Shapes of 0 to 3 dims with sides 0..3: 0-d, zero-size and size-1 dims all come up.
shapes_with_empty = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
# Two shapes that broadcast together, zero-size sides included.
broadcastable_pairs_with_empty = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                                   min_side=0, max_side=3)
# The dtypes the promotion rules are checked over.
PROMOTION_DTYPES = (np.bool_, np.int32, np.int64, np.float32, np.float64)
promotion_dtypes = st.sampled_from(PROMOTION_DTYPES).map(np.dtype)


@st.composite
def shapes_and_dims(draw, min_dims=0, tuples=True):
    """A shape with zero-size sides allowed, and a reduction dim: None, one (maybe negative)
    dim, or (with `tuples`) a tuple of them. A 0-d shape accepts dim 0 and -1, as in PyTorch."""
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=3))
    n = len(shape) or 1
    dims = st.none() | st.integers(-n, n - 1)
    if tuples and shape:
        dims = dims | hnp.valid_tuple_axes(len(shape), min_size=1)
    return shape, draw(dims)


# --- minitensor (shape, indexing and sorting ops) ------------------------------------


@st.composite
def shapes_and_dim(draw, min_dims=1):
    """A shape of 1..3 dims with sides 0..3 (zero-size ones included) and one dim of it,
    maybe negative."""
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=3))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


# --- minitensor (einsum, scatter_reduce, pad: issue 49) -------------------------------


@st.composite
def einsum_cases(draw, max_operands=3):
    """(equation, shapes) of a valid einsum: 1..3 operands of 0..3 letters from "ijkl"
    (repeats within one operand make diagonals), sides 1..3 with some dims of 1 that
    broadcast, an explicit output of distinct letters or none (PyTorch's implicit one),
    and sometimes a leading `...` of 0..2 broadcasting dims."""
    letters = "ijkl"
    sizes = {c: draw(st.integers(1, 3)) for c in letters}
    n = draw(st.integers(1, max_operands))
    terms = [draw(st.lists(st.sampled_from(letters), max_size=3)) for _ in range(n)]
    ellipsis = draw(st.booleans())
    batch = draw(st.lists(st.integers(1, 3), max_size=2)) if ellipsis else []
    shapes = []
    for term in terms:
        own = [1 if draw(st.integers(0, 4)) == 0 else sizes[c] for c in term]  # size 1 broadcasts
        for c, side in zip(term, own):  # a repeated letter is a diagonal: all its sides alike
            own = [side if d == c else s for d, s in zip(term, own)]
        lead = batch[len(batch) - draw(st.integers(0, len(batch))):] if ellipsis else []
        lead = [1 if draw(st.integers(0, 3)) == 0 else s for s in lead]
        shapes.append(tuple(lead) + tuple(own))
    used = sorted(set("".join("".join(t) for t in terms)))
    inputs = ",".join(("..." if ellipsis else "") + "".join(t) for t in terms)
    if draw(st.booleans()):
        return inputs, shapes
    output = "".join(draw(st.permutations(used))[:draw(st.integers(0, len(used)))])
    return f"{inputs}->{'...' if ellipsis else ''}{output}", shapes


@st.composite
def scatter_reduce_cases(draw):
    """(shape, dim, index shape, src shape): index no larger than the input outside `dim`
    and no larger than src anywhere; entries along `dim` are drawn by the test."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    index = tuple(draw(st.integers(0, 4 if d == dim % len(shape) else n)) for d, n in enumerate(shape))
    src = tuple(i + draw(st.integers(0, 1)) for i in index)
    return shape, dim, index, src


@st.composite
def pad_cases(draw):
    """(shape, pad, mode): a shape of 1..3 dims and a flat (before, after) list over its last
    dims that the mode accepts (constant may cut; reflect pads less than the side)."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    mode = draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
    pad = []
    for n in reversed(shape[len(shape) - draw(st.integers(1, len(shape))):]):
        low = -(n // 2) if mode == "constant" else 0
        high = n - 1 if mode == "reflect" else n if mode == "circular" else 3
        pad += [draw(st.integers(low, high)), draw(st.integers(low, high))]
    return shape, tuple(pad), mode


# --- minitensor.nn.flash_attention -----------------------------------------------

@st.composite
def flash_cases(draw, min_keys=1):
    """(batch, heads, T_q, T_k, head size, block_q, block_k, causal, masked): block sizes
    drawn independently of T (most do not divide it; some exceed it)."""
    t_q = draw(st.integers(1, 13))
    t_k = t_q if draw(st.booleans()) else draw(st.integers(min_keys, 13))
    return dict(batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)), t_q=t_q, t_k=t_k,
                d=draw(st.integers(1, 5)), block_q=draw(st.integers(1, 9)), block_k=draw(st.integers(1, 9)),
                causal=draw(st.booleans()), masked=draw(st.booleans()))


# --- minitensor.nn.moe: DeepSeek-style routing (issue 45) -----------------------------


@st.composite
def deepseek_routings(draw):
    """Settings of one MoE layer's routing: E experts, k, score, shared experts, expert width,
    G expert groups and a limit M of groups per token, a float32 bias (0 or drawn), and whether
    two experts' router rows are equal (a tie)."""
    experts = draw(st.integers(2, 6))
    score = draw(st.sampled_from(["softmax", "sigmoid"]))
    k = draw(st.integers(2 if score == "sigmoid" else 1, experts))
    bias = draw(st.one_of(st.just(None), hnp.arrays(np.float32, experts, elements=st.floats(-0.5, 0.5, width=32))))
    groups = draw(st.sampled_from([g for g in range(1, experts + 1) if experts % g == 0]))
    limit = draw(st.integers(1, groups))  # device-limited: a token's experts in at most `limit` groups
    if limit * (experts // groups) < k or -(-k // limit) > experts // groups:
        limit = groups
    return dict(experts=experts, k=k, score=score, shared=draw(st.integers(0, 2)), width=draw(st.integers(1, 5)),
                groups=groups, limit=limit,
                renormalize=draw(st.booleans()) or score == "sigmoid", bias=bias, tie=draw(st.booleans()),
                tokens=draw(st.integers(1, 4)), seed=draw(seeds))


@st.composite
def aux_loss_cases(draw):
    """A balancing loss's setting: E experts, k, the score, its scope ("sequence" or "batch"), and
    a batch of 1-3 sequences of 1-4 tokens."""
    experts = draw(st.integers(2, 6))
    score = draw(st.sampled_from(["softmax", "sigmoid"]))
    return dict(experts=experts, score=score, k=draw(st.integers(2 if score == "sigmoid" else 1, experts)),
                scope=draw(st.sampled_from(["sequence", "batch"])), sequences=draw(st.integers(1, 3)),
                tokens=draw(st.integers(1, 4)), seed=draw(seeds))


# --- parallel.pipeline.dualpipe (DualPipeV in 3D) ----------------------------------

@st.composite
def dualpipev_layouts(draw, max_world=8):
    """`hybrid_layouts` under DualPipeV: two chunks per rank (stages r and 2pp-1-r), m in 2pp..2pp+2,
    at least 2pp blocks, the ZeRO stage drawn from 0..3."""
    drawn = draw(hybrid_layouts(max_world))
    pp = drawn["layout"]["pp"]
    layout = dict(drawn["layout"], schedule="dualpipev", chunks=2, microbatches=draw(st.integers(2 * pp, 2 * pp + 2)),
                  zero=draw(st.sampled_from([0, 1, 2, 3])))
    config = dict(drawn["config"], n_layer=2 * pp + draw(st.integers(0, 1)))
    return dict(drawn, layout=layout, config=config)


@st.composite
def dualpipe_layouts(draw, max_world=8):
    """`hybrid_layouts` under the bidirectional DualPipe: pp even (2 or 4, dp shrunk to fit), two chunks
    per rank (stage r and the mirrored copy of pp-1-r), m even in 2pp..2pp+4, the ZeRO stage 0..3."""
    drawn = draw(hybrid_layouts(max_world))
    tp = drawn["layout"]["tp"]
    pp = draw(st.sampled_from([p for p in (2, 4) if tp * p <= max_world]))
    dp = max(1, min(drawn["layout"]["dp"], max_world // (tp * pp)))
    layout = dict(drawn["layout"], dp=dp, pp=pp, schedule="dualpipe", chunks=2,
                  microbatches=2 * pp + 2 * draw(st.integers(0, 2)), zero=draw(st.sampled_from([0, 1, 2, 3])))
    config = dict(drawn["config"], n_layer=pp + draw(st.integers(0, 1)))
    return dict(drawn, layout=layout, config=config)


# --- minitensor.fp8 --------------------------------------------------------------

@st.composite
def fp8_gemm_shapes(draw):
    """(M, N, K, tile) of a block-scaled product: K and N often not multiples of the tile."""
    tile = draw(st.sampled_from([4, 16, 128]))
    return draw(st.integers(1, 9)), draw(st.integers(1, 2 * tile + 3)), draw(st.integers(1, 3 * tile + 5)), tile


# --- parallel.expert_parallel (dispatch per (token, rank)) ------------------------

@st.composite
def expert_dispatches(draw):
    """One MoE layer's routing over ep ranks: ep, experts per rank, k, the device limit M (an M
    that cannot hold k experts becomes ep), a capacity factor (None: dropless), sequences of T
    tokens per rank (few tokens: experts nobody chose), the score, and a tie of two experts."""
    ep, local = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3))
    experts = ep * local
    score = draw(st.sampled_from(["softmax", "sigmoid"] if experts > 1 else ["softmax"]))  # sigmoid needs k ≥ 2
    k = draw(st.integers(2 if score == "sigmoid" else 1, min(experts, 4)))
    limit = draw(st.integers(1, ep))
    if limit * local < k or -(-k // limit) > local:
        limit = ep
    return dict(ep=ep, experts=experts, k=k, limit=limit, score=score,
                capacity=draw(st.sampled_from([None, 0.5, 1.0])), sequences=draw(st.integers(1, 2)),
                tokens=draw(st.integers(1, 5)), tie=draw(st.booleans()), seed=draw(seeds))
