"""PowerSGD (Vogels, Karimireddy, Jaggi 2019): each gradient matrix sent as a rank-r product P·Qᵀ.

For a gradient M of shape m × k (a ≥ 2-D tensor seen as shape[0] × the rest) and the
previous step's Q (k × r, random at first: the "warm start" that makes one power
iteration per step enough), every rank, on its own error-corrected M_i:

    P_i = M_i Q                 all-reduce:  P = Σ P_i          (m·r numbers)
    P̂  = orthonormal columns of P (Gram–Schmidt)
    Q_i = M_iᵀ P̂               all-reduce:  Q = Σ Q_i          (k·r numbers)
    sum ≈ P̂ Qᵀ = P̂ P̂ᵀ Σ M_i    (the projection of the summed gradient on P̂'s columns)

so (m + k)·r numbers travel instead of m·k. Both all-reduces carry every matrix of the
bucket at once (two small all-reduces per bucket), beside one all-reduce of the tensors
left uncompressed: 1-D tensors and matrices whose factors would not be more than
`min_compression_rate` times smaller (PyTorch's `_should_compress`: m·k > rate·(m + k)·r,
strictly). Each rank keeps error = M_i − P̂ Qᵀ/n (error_feedback.py) and Q/n as the next
warm start.

Every step above is linear in the M_i once P̂ is fixed, and P̂ depends only on Σ P_i, so
n ranks compute exactly what one process computes on the mean gradient (with the mean
error): the test's reference. At rank r = min(m, k), P̂ P̂ᵀ is the identity on M's
column space: plain data parallelism.
"""
import math

import numpy as np

from ..reducer import allreduce_hook
from .error_feedback import ErrorFeedback


def orthogonalize(p):
    """Make the columns of `p` orthonormal, in place: Gram–Schmidt, each projection taken twice
    ("twice is enough": a nearly dependent column, as a gradient of low rank gives, stays
    orthogonal to machine precision); a zero column stays zero."""
    # exercise 12.2: orthogonalise P
    # hint: for each column i in turn: subtract its components along the columns before it
    # hint: (before @ (before.T @ column)) twice, then divide it by its norm unless that is 0.
    for i in range(p.shape[1]):
        column, before = p[:, i], p[:, :i]
        for _ in range(2):
            column -= before @ (before.T @ column)
        norm = np.linalg.norm(column)
        if norm > 0:
            column /= norm
    # end exercise
    return p


def full_rank_query(q, rng):
    """Q's columns made orthonormal and independent, in place, before P = M·Q. A warm-started
    Q = Mᵀ·P̂ has at most the rank of last round's M; with fewer independent columns than
    this round's M has rank, span(P) misses part of M and even full-rank PowerSGD stops being
    exact. Orthonormalising within span(Q) leaves span(M·Q), hence P̂·P̂ᵀ·M, unchanged; a
    column dependent on those before it is replaced by a random one (`rng`: alike on every rank).
    The columns B before column c are orthonormal by then, so c's part outside their span has the
    squared norm ‖c‖² − ‖Bᵀc‖² (Pythagoras); at the round-off of that difference, c counts as dependent."""
    tiny = 100 * np.finfo(q.dtype).eps
    for i in range(q.shape[1]):
        column, before = q[:, i], q[:, :i]
        size = column @ column
        if size - np.sum((before.T @ column) ** 2) <= tiny * size:  # dependent on the columns before (or zero)
            column[...] = rng.standard_normal(len(column))
        orthogonalize(q[:, :i + 1])  # those before stay as they are (to round-off); column i joins them
    return q


class PowerSGD:
    """A reducer communication hook: rank-`rank` PowerSGD with error feedback, after
    `start_step` rounds of plain all-reduce (state: errors, Q per matrix, the round)."""

    def __init__(self, rank, start_step=0, min_compression_rate=2.0, seed=0):
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD: rank={rank!r} must be an int ≥ 1")
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"PowerSGD: start_step={start_step!r} must be an int ≥ 0")
        self.rank, self.start_step = rank, start_step
        self.min_compression_rate, self.seed = min_compression_rate, seed
        self.step = 0  # rounds started (a round: every bucket once)
        self.feedback = ErrorFeedback()
        self.qs = {}  # (bucket index, matrix number) -> Q of the last round, k × r

    def __repr__(self):
        return f"PowerSGD(rank={self.rank}, start_step={self.start_step})"

    def matrix_shape(self, shape):
        """(m, k, r) if a gradient of `shape` is compressed, else None."""
        if len(shape) < 2:
            return None
        m, k = shape[0], math.prod(shape[1:])
        r = min(self.rank, m, k)
        return (m, k, r) if m * k > self.min_compression_rate * (m + k) * r else None

    def plan(self, bucket):
        """([(slice, (m, k, r))] of the compressed matrices, [slice] of the rest) of a bucket."""
        matrices, plain = [], []
        for p, where in zip(bucket.params, bucket.slices):
            shape = self.matrix_shape(p.shape)
            if shape is None:
                plain.append(where)
            else:
                matrices.append((where, shape))
        return matrices, plain

    def initial_q(self, index, number, k, r, dtype):
        """The same random Q on every rank: seeded by (seed, bucket, matrix)."""
        return np.random.default_rng([self.seed, index, number]).standard_normal((k, r)).astype(dtype)

    def __call__(self, group, index, bucket):
        if index == 0:
            self.step += 1
        matrices, plain = self.plan(bucket)
        if self.step <= self.start_step or not matrices:
            return allreduce_hook(group, index, bucket)
        corrected = self.feedback.correct(index, bucket.buffer).copy()
        plain_values = np.concatenate([corrected[where] for where in plain]) if plain else None
        plain_request = group.all_reduce(plain_values, async_op=True) if plain else None
        ms = [corrected[where].reshape(m, k) for where, (m, k, _) in matrices]
        qs = [self.qs.get((index, j)) for j in range(len(matrices))]
        qs = [full_rank_query(q.copy(), np.random.default_rng([self.seed, index, j, self.step])) if q is not None
              else self.initial_q(index, j, k, r, corrected.dtype) for j, (q, (_, (_, k, r))) in enumerate(zip(qs, matrices))]
        ps = np.concatenate([(m @ q).reshape(-1) for m, q in zip(ms, qs)])
        p_request = group.all_reduce(ps, async_op=True)
        return PowerSGDRound(self, group, index, bucket, corrected, matrices, plain, ms,
                             plain_request, plain_values, p_request, ps)

    def state_dict(self):
        state = {"step": np.array(self.step), **self.feedback.state_dict()}
        state.update({f"q.{index}.{number}": q.copy() for (index, number), q in self.qs.items()})
        return state

    def load_state_dict(self, state):
        self.step = int(state["step"])
        self.feedback.load_state_dict(state)
        self.qs = {tuple(int(i) for i in key.split(".")[1:]): np.array(value)
                   for key, value in state.items() if key.startswith("q.")}


class PowerSGDRound:
    """A bucket's PowerSGD in flight: P's all-reduce started; wait() does the rest."""

    def __init__(self, hook, group, index, bucket, corrected, matrices, plain, ms,
                 plain_request, plain_values, p_request, ps):
        self.hook, self.group, self.index, self.bucket = hook, group, index, bucket
        self.corrected, self.matrices, self.plain, self.ms = corrected, matrices, plain, ms
        self.plain_request, self.plain_values = plain_request, plain_values
        self.p_request, self.ps = p_request, ps

    def wait(self):
        buffer, n = self.bucket.buffer, self.group.size
        self.p_request.wait()
        ps_hat, offset = [], 0
        for _, (m, _, r) in self.matrices:
            ps_hat.append(orthogonalize(self.ps[offset:offset + m * r].reshape(m, r)))
            offset += m * r
        qs = np.concatenate([(m.T @ p_hat).reshape(-1) for m, p_hat in zip(self.ms, ps_hat)])
        self.group.all_reduce(qs)  # Σ_i M_iᵀ P̂
        sent = self.corrected.copy()  # the uncompressed tensors are sent exactly
        offset = 0
        for j, ((where, (_, k, r)), p_hat) in enumerate(zip(self.matrices, ps_hat)):
            q_sum = qs[offset:offset + k * r].reshape(k, r)
            offset += k * r
            buffer[where] = (p_hat @ q_sum.T).reshape(-1)  # ≈ Σ_i M_i
            sent[where] = buffer[where] / n  # this rank's share: the mean approximation
            self.hook.qs[(self.index, j)] = q_sum / n  # the next round's warm start
        self.hook.feedback.remember(self.index, self.corrected, sent)
        if self.plain:
            self.plain_request.wait()
            offset = 0
            for where in self.plain:
                size = where.stop - where.start
                buffer[where] = self.plain_values[offset:offset + size]
                offset += size
        return buffer
