"""The recurrent kernels (kernels/cpu/recurrent.py: Mamba2's ssm_scan, the gated delta rule, Mamba2's convolution
and LFM2's short convolution) against plain float64 recurrences written from their definitions, and the
properties the engine relies on: a sequence in pieces gives the bits of one pass, sequences batched give the
bits of each alone (also where one sequence ends and another starts in the same slot), a sequence's first
token ignores whatever its slot held, a checkpoint holds the state after its token. Widths cover the scans'
blocks of 32 columns and of 8 after them, and a convolution's channels past the last multiple of 8."""

import math

import numpy as np
import pytest

from edgeinfer.kernels.cpu import recurrent


def _softplus(x):
    return x if x > 20 else math.log1p(math.exp(x))


class Kernel:
    """One kernel at one size: `rows(rng, T)` a sequence's per-token inputs, `weights` a layer's, `state_shape`
    (slots, ...), `run` the kernel, `reference` the float64 recurrence of one sequence from a zero state."""

    def __init__(self, name, size):
        self.name, self.size = name, size
        rng = np.random.default_rng(7)
        if name == "scan":
            H, P, N, G = size
            self.state_shape = (H, P, N)
            self.weights = ((0.5 * rng.standard_normal(H) - 1).astype(np.float32),
                            -np.exp(0.5 * rng.standard_normal(H)).astype(np.float32),
                            (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        elif name == "delta":
            H, Hk, D, interleaved = size
            self.state_shape = (H, D, D)
            self.weights = (rng.standard_normal(H).astype(np.float32),
                            -np.exp(0.5 * rng.standard_normal(H)).astype(np.float32))
        else:  # "conv" (Mamba2's, with a bias and SiLU) or "short" (LFM2's gated one)
            C, L = size
            self.state_shape = (L - 1, C)
            self.weights = ((0.5 * rng.standard_normal((L, C))).astype(np.float32),
                            (0.1 * rng.standard_normal(C)).astype(np.float32))

    def rows(self, rng, T):
        if self.name == "scan":
            H, P, N, G = self.size
            return [rng.standard_normal((T, H * P + 2 * G * N)).astype(np.float32),
                    rng.standard_normal((T, H)).astype(np.float32)]
        if self.name == "delta":
            H, Hk, D, _ = self.size
            return [rng.standard_normal((T, 2 * Hk * D + H * D)).astype(np.float32),
                    rng.standard_normal((T, H)).astype(np.float32),
                    rng.standard_normal((T, H)).astype(np.float32)]
        C, _ = self.size
        return [rng.standard_normal((T, 3 * C if self.name == "short" else C)).astype(np.float32)]

    def run(self, rows, state, seq, pos, slots, snap):
        T = rows[0].shape[0]
        if self.name == "scan":
            H, P, N, G = self.size
            y = np.empty((T, H * P), np.float32)
            recurrent.ssm_scan(rows[0], rows[1], *self.weights, G, state, seq, pos, slots, snap, y)
        elif self.name == "delta":
            H, Hk, D, interleaved = self.size
            y = np.empty((T, H * D), np.float32)
            recurrent.delta_rule(rows[0].copy(), rows[1], rows[2], *self.weights, Hk, interleaved, 1e-6, state, seq,
                                 pos, slots, snap, y)
        elif self.name == "conv":
            y = np.empty_like(rows[0])
            recurrent.ssm_conv(rows[0], *self.weights, state, seq, pos, slots, snap, y)
        else:
            y = np.empty((T, self.size[0]), np.float32)
            recurrent.shortconv(rows[0], self.weights[0], state, seq, pos, slots, snap, y)
        return y

    def reference(self, rows):
        T = rows[0].shape[0]
        if self.name == "scan":
            H, P, N, G = self.size
            xbc, dt = (r.astype(np.float64) for r in rows)
            dt_bias, a, d = self.weights
            s, y = np.zeros((H, P, N)), np.zeros((T, H * P))
            for t in range(T):
                for h in range(H):
                    g = h // (H // G)
                    x = xbc[t, h * P:(h + 1) * P]
                    b = xbc[t, H * P + g * N:H * P + (g + 1) * N]
                    c = xbc[t, H * P + (G + g) * N:H * P + (G + g + 1) * N]
                    dts = _softplus(dt[t, h] + dt_bias[h])
                    s[h] = s[h] * math.exp(dts * a[h]) + dts * np.outer(x, b)
                    y[t, h * P:(h + 1) * P] = s[h] @ c + d[h] * x
            return y
        if self.name == "delta":
            H, Hk, D, interleaved = self.size
            qkv, alpha, beta = (r.astype(np.float64) for r in rows)
            dt_bias, a = self.weights
            key = Hk * D
            s, y = np.zeros((H, D, D)), np.zeros((T, H * D))
            for t in range(T):
                for h in range(H):
                    kh = h // (H // Hk) if interleaved else h % Hk
                    q, k = qkv[t, kh * D:(kh + 1) * D], qkv[t, key + kh * D:key + (kh + 1) * D]
                    q, k = q / math.sqrt(q @ q + 1e-6), k / math.sqrt(k @ k + 1e-6)
                    v = qkv[t, 2 * key + h * D:2 * key + (h + 1) * D]
                    s[h] *= math.exp(_softplus(alpha[t, h] + dt_bias[h]) * a[h])
                    dv = (v - s[h].T @ k) / (1 + math.exp(-beta[t, h]))
                    s[h] += np.outer(k, dv)
                    y[t, h * D:(h + 1) * D] = s[h].T @ q / math.sqrt(D)
            return y
        C, L = self.size
        w, bias = (x.astype(np.float64) for x in self.weights)
        src = rows[0].astype(np.float64)
        inp = src[:, :C] * src[:, 2 * C:] if self.name == "short" else src
        padded = np.concatenate([np.zeros((L - 1, C)), inp])
        conv = np.stack([(padded[t:t + L] * w).sum(0) for t in range(T)])
        if self.name == "short":
            return src[:, C:2 * C] * conv
        z = conv + bias
        return z / (1 + np.exp(-z))


KERNELS = [("scan", (4, 64, 32, 2)), ("scan", (3, 40, 16, 1)), ("delta", (4, 2, 64, False)),
           ("delta", (4, 2, 64, True)),
           ("delta", (2, 1, 40, False)), ("conv", (70, 4)), ("short", (70, 3)), ("conv", (64, 2))]
IDS = [f"{k}-{'x'.join(str(int(v)) for v in size)}" for k, size in KERNELS]


def _sequence(T, start=0):
    return np.zeros(T, np.int64), np.arange(start, start + T, dtype=np.int64), np.full(T, -1, np.int64)


def _garbage(kernel, slots):
    # a state pool full of what earlier sequences left: a sequence's first token must not read it
    return np.random.default_rng(99).standard_normal((slots, *kernel.state_shape)).astype(np.float32)


@pytest.mark.parametrize("name,size", KERNELS, ids=IDS)
def test_the_kernel_is_the_recurrence_and_pieces_give_one_pass(name, size):
    k = Kernel(name, size)
    T = 37
    rows = k.rows(np.random.default_rng(1), T)
    slots = np.array([1], np.int64)
    whole = _garbage(k, 3)
    y = k.run(rows, whole, *_sequence(T)[:2], slots, _sequence(T)[2])
    ref = k.reference(rows)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
    pieces = _garbage(k, 3)[::-1].copy()
    for a, b in ((0, 1), (1, 2), (2, 4), (4, 5), (5, 21), (21, 22), (22, 37)):  # chunks, runs shorter than a window
        seq, pos, snap = _sequence(b - a, a)
        assert (k.run([r[a:b] for r in rows], pieces, seq, pos, slots, snap) == y[a:b]).all(), (a, b)
    assert (pieces[1] == whole[1]).all()


def _batch(n0, n1):
    # two sequences' tokens in one batch, in alternating runs of a few tokens, as the scheduler mixes a prompt's
    # chunk with another sequence's decode steps
    order = [(0, i) for i in range(n0)] + [(1, i) for i in range(n1)]
    return sorted(order, key=lambda x: (x[1] // 3, x[0]))


@pytest.mark.parametrize("name,size", KERNELS, ids=IDS)
def test_sequences_batched_give_each_alone_and_checkpoints_hold_the_state_after_their_token(name, size):
    k = Kernel(name, size)
    n = (11, 7)
    rng = np.random.default_rng(3)
    inputs = [k.rows(rng, m) for m in n]
    alone = []
    for rows, m in zip(inputs, n):
        st = _garbage(k, 1)
        alone.append((k.run(rows, st, *_sequence(m)[:2], np.array([0], np.int64), _sequence(m)[2]), st[0].copy()))
    order = _batch(*n)
    rows = [np.stack([inputs[s][j][i] for s, i in order]) for j in range(len(inputs[0]))]
    seq = np.array([s for s, _ in order], np.int64)
    pos = np.array([i for _, i in order], np.int64)
    snap = np.full(len(order), -1, np.int64)
    snap[order.index((0, 4))] = 3  # sequence 0 after its token 4 (its next token follows in the same run)
    snap[order.index((1, 5))] = 4  # sequence 1 after its token 5 (the last of a run)
    st = _garbage(k, 5)
    y = k.run(rows, st, seq, pos, np.array([2, 0], np.int64), snap)
    for r, (s, i) in enumerate(order):
        assert (y[r] == alone[s][0][i]).all(), (s, i)
    assert (st[2] == alone[0][1]).all() and (st[0] == alone[1][1]).all()
    for slot, (s, m) in ((3, (0, 5)), (4, (1, 6))):
        check = _garbage(k, 1)
        k.run([r[:m] for r in inputs[s]], check, *_sequence(m)[:2], np.array([0], np.int64), _sequence(m)[2])
        assert (st[slot] == check[0]).all(), slot


@pytest.mark.parametrize("name,size", KERNELS, ids=IDS)
def test_a_sequence_starting_in_the_slot_another_just_used_starts_from_zero(name, size):
    # in one batch: sequence A's 6 tokens, then sequence B from position 0 in the same slot (no state of A may
    # carry over, neither the state nor a sum taken ahead for the next token)
    k = Kernel(name, size)
    rng = np.random.default_rng(5)
    a, b = k.rows(rng, 6), k.rows(rng, 5)
    st = _garbage(k, 1)
    y = k.run([np.concatenate([x, z]) for x, z in zip(a, b)], st, np.zeros(11, np.int64),
              np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4], np.int64), np.array([0], np.int64), np.full(11, -1, np.int64))
    alone = _garbage(k, 1)
    yb = k.run(b, alone, *_sequence(5)[:2], np.array([0], np.int64), _sequence(5)[2])
    assert (y[6:] == yb).all() and (st == alone).all()
