"""Which tokens each context-parallel rank holds, and what that costs it.

The sequence of length T is cut into equal chunks; rank r of cp holds

    contiguous   chunk r of cp                        (chunks of T/cp tokens)
    zigzag       chunks r and 2·cp−1−r of 2·cp        (chunks of T/(2·cp) tokens)

Under the causal mask a query sees only earlier keys. With the contiguous split rank r's
queries see r whole blocks before theirs plus the lower half of their own diagonal block:
work ∝ r + ½, so the last rank does (2·cp−1)/cp times the mean (1.875× at cp = 8) while
rank 0 idles. Zigzag pairs an early chunk with a late one: chunk r sees r chunks and half
its own, chunk 2·cp−1−r sees 2·cp−1−r and half its own; the sum, 2·cp−1 chunks plus one,
is the same on every rank.

    T = 8, cp = 2        positions 0 1 2 3 4 5 6 7
        contiguous       rank      0 0 0 0 1 1 1 1
        zigzag           rank      0 0 1 1 1 1 0 0

Counting work: one unit is one (query, key) pair that the mask lets through, per batch row
and head; a diagonal chunk of c tokens holds c(c+1)/2 of them.
"""
import numpy as np

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"context parallel layout {layout!r} is not one of {LAYOUTS}")


def num_chunks(cp, layout):
    """How many equal chunks the sequence is cut into."""
    return 2 * cp if layout == "zigzag" else cp


def check_sequence_length(seq_len, cp, layout):
    """A ValueError naming both numbers unless the layout can cut `seq_len` into its chunks."""
    check_layout(layout)
    n = num_chunks(cp, layout)
    if seq_len % n:
        what = f"2·cp = {n} (the zigzag layout cuts it into 2·cp chunks)" if layout == "zigzag" else f"cp = {n}"
        raise ValueError(f"context parallelism: sequence length {seq_len} is not divisible by {what}")


def rank_chunks(rank, cp, layout):
    """The chunk indices rank `rank` holds, in the order its local sequence lays them out."""
    return [rank, 2 * cp - 1 - rank] if layout == "zigzag" else [rank]


def token_positions(seq_len, rank, cp, layout):
    """The global positions of the tokens rank `rank` holds, in local order."""
    check_sequence_length(seq_len, cp, layout)
    size = seq_len // num_chunks(cp, layout)
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in rank_chunks(rank, cp, layout)])


def causal_relation(q_chunk, k_chunk):
    """How a query chunk sees a key chunk under the causal mask: "past" (every pair),
    "diagonal" (the lower triangle) or "future" (nothing: skipped)."""
    return "past" if q_chunk > k_chunk else "diagonal" if q_chunk == k_chunk else "future"


def unmasked_pairs(relation, size):
    """Unmasked (query, key) pairs of two chunks of `size` tokens."""
    return {"past": size * size, "diagonal": size * (size + 1) // 2, "future": 0, "full": size * size}[relation]


def attention_work(seq_len, rank, cp, layout, causal=True):
    """The formula: unmasked (query, key) pairs rank `rank` computes for one sequence, per
    batch row and head (its queries against every key chunk of the ring)."""
    check_sequence_length(seq_len, cp, layout)
    n = num_chunks(cp, layout)
    size = seq_len // n
    if not causal:
        return (seq_len // cp) * seq_len
    return sum(unmasked_pairs(causal_relation(q, k), size) for q in rank_chunks(rank, cp, layout) for k in range(n))


def ring_elements(batch, seq_len, hidden, cp):
    """Elements one rank sends around the ring per attention layer and sequence batch, forward
    and backward: `hidden` is the rank's K (or V) width (d_model / tp). A K or V block is
    batch·seq_len/cp·hidden elements. Forward passes K and V on cp−1 times; backward passes
    them on cp−1 times again, and their gradients dK, dV cp times (home to the owner).
    With cp = 1 nothing moves."""
    block = batch * (seq_len // cp) * hidden
    grads_home = 2 * cp * block if cp > 1 else 0
    return {"forward": 2 * (cp - 1) * block, "backward": 2 * (cp - 1) * block + grads_home}


def all_to_all_elements(batch, seq_len, hidden, cp):
    """Elements one rank sends per attention layer under Ulysses (ulysses.py): q, k, v out and
    the output back, 4 all-to-alls forward and their 4 conjugates backward, each sending
    (cp−1)/cp of a batch·seq_len/cp·hidden block."""
    piece = batch * (seq_len // cp) * hidden // cp
    return {"forward": 4 * (cp - 1) * piece, "backward": 4 * (cp - 1) * piece}
