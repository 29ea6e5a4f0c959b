"""The recurrent scans (kernels/cpu/recurrent.py: Mamba2's ssm_scan, the gated delta rule) against plain float64
recurrences written from their definitions, and the properties the engine relies on: a sequence in pieces gives
the bits of one pass, sequences batched give the bits of each alone, a checkpoint holds the state after its
token. Sizes cover a head's four-vector blocks of 32 columns and the one-vector blocks after them."""

import math

import numpy as np
import pytest

from edgeinfer.kernels.cpu import recurrent


def _softplus(x):
    return x if x > 20 else math.log1p(math.exp(x))


def _scan_inputs(rng, T, H, P, N, G):
    return (rng.standard_normal((T, H * P + 2 * G * N)).astype(np.float32), rng.standard_normal((T, H)).astype(np.float32),
            (0.5 * rng.standard_normal(H) - 1).astype(np.float32), -np.exp(0.5 * rng.standard_normal(H)).astype(np.float32),
            (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))


def _scan_reference(xbc, dt, dt_bias, a, d, H, P, N, G):
    # s = s exp(dt' a) + dt' x B, y = s . C + d x, every head and token, in float64
    s = np.zeros((H, P, N))
    y = np.zeros((xbc.shape[0], H * P))
    for t in range(xbc.shape[0]):
        for h in range(H):
            g = h // (H // G)
            x = xbc[t, h * P:(h + 1) * P].astype(np.float64)
            b = xbc[t, H * P + g * N:H * P + (g + 1) * N].astype(np.float64)
            c = xbc[t, H * P + (G + g) * N:H * P + (G + g + 1) * N].astype(np.float64)
            dts = _softplus(float(dt[t, h]) + float(dt_bias[h]))
            s[h] = s[h] * math.exp(dts * a[h]) + dts * np.outer(x, b)
            y[t, h * P:(h + 1) * P] = s[h] @ c + d[h] * x
    return y


def _scan(inputs, G, state, seq, pos, slots, snap):
    xbc, dt, dt_bias, a, d = inputs
    y = np.empty((xbc.shape[0], state.shape[1] * state.shape[2]), np.float32)
    recurrent.ssm_scan(xbc, dt, dt_bias, a, d, G, state, seq, pos, slots, snap, y)
    return y


def _delta_inputs(rng, T, H, Hk, D):
    return (rng.standard_normal((T, 2 * Hk * D + H * D)).astype(np.float32), rng.standard_normal((T, H)).astype(np.float32),
            rng.standard_normal((T, H)).astype(np.float32), rng.standard_normal(H).astype(np.float32),
            -np.exp(0.5 * rng.standard_normal(H)).astype(np.float32))


def _delta_reference(qkv, alpha, beta, dt_bias, a, H, Hk, D, interleaved, eps):
    # S = S exp(g); d = (v - S^T k) sigmoid(beta); S += k d^T; y = S^T q / sqrt(D), q and k L2-normed; in float64
    key = Hk * D
    s = np.zeros((H, D, D))
    y = np.zeros((qkv.shape[0], H * D))
    for t in range(qkv.shape[0]):
        for h in range(H):
            kh = h // (H // Hk) if interleaved else h % Hk
            q = qkv[t, kh * D:(kh + 1) * D].astype(np.float64)
            k = qkv[t, key + kh * D:key + (kh + 1) * D].astype(np.float64)
            q, k = q / math.sqrt(q @ q + eps), k / math.sqrt(k @ k + eps)
            v = qkv[t, 2 * key + h * D:2 * key + (h + 1) * D].astype(np.float64)
            s[h] *= math.exp(_softplus(float(alpha[t, h]) + float(dt_bias[h])) * a[h])
            dv = (v - s[h].T @ k) / (1 + math.exp(-float(beta[t, h])))
            s[h] += np.outer(k, dv)
            y[t, h * D:(h + 1) * D] = s[h].T @ q / math.sqrt(D)
    return y


def _delta(inputs, Hk, interleaved, state, seq, pos, slots, snap):
    qkv, alpha, beta, dt_bias, a = inputs
    y = np.empty((qkv.shape[0], state.shape[1] * state.shape[3]), np.float32)
    recurrent.delta_rule(qkv.copy(), alpha, beta, dt_bias, a, Hk, interleaved, 1e-6, state, seq, pos, slots, snap, y)
    return y


def _one_sequence(T, start=0):
    return np.zeros(T, np.int64), np.arange(start, start + T, dtype=np.int64), np.full(T, -1, np.int64)


def _rows(inputs, a, b):
    return tuple(x[a:b] if x.ndim == 2 else x for x in inputs)


@pytest.mark.parametrize("H,P,N,G", [(4, 64, 32, 2), (3, 40, 16, 1)])  # 40: a block of 32 channels, one of 8
def test_ssm_scan_is_the_recurrence_and_pieces_give_one_pass(H, P, N, G):
    T = 37
    inputs = _scan_inputs(np.random.default_rng(1), T, H, P, N, G)
    slots = np.array([0], np.int64)
    whole = np.zeros((3, H, P, N), np.float32)
    y = _scan(inputs, G, whole, *_one_sequence(T)[:2], slots, _one_sequence(T)[2])
    ref = _scan_reference(*inputs, H, P, N, G)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
    pieces = np.zeros_like(whole)
    for a, b in ((0, 1), (1, 9), (9, 10), (10, 37)):  # a prompt in chunks, then one-token decode steps
        seq, pos, snap = _one_sequence(b - a, a)
        assert (_scan(_rows(inputs, a, b), G, pieces, seq, pos, slots, snap) == y[a:b]).all()
    assert (pieces[0] == whole[0]).all()


@pytest.mark.parametrize("H,Hk,D,interleaved", [(4, 2, 64, False), (4, 2, 64, True), (2, 1, 40, False)])
def test_delta_rule_is_the_recurrence_and_pieces_give_one_pass(H, Hk, D, interleaved):
    T = 37
    inputs = _delta_inputs(np.random.default_rng(2), T, H, Hk, D)
    slots = np.array([1], np.int64)
    whole = np.zeros((2, H, D, D), np.float32)
    y = _delta(inputs, Hk, interleaved, whole, *_one_sequence(T)[:2], slots, _one_sequence(T)[2])
    ref = _delta_reference(*inputs, H, Hk, D, interleaved, 1e-6)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
    pieces = np.zeros_like(whole)
    for a, b in ((0, 1), (1, 9), (9, 10), (10, 37)):
        seq, pos, snap = _one_sequence(b - a, a)
        assert (_delta(_rows(inputs, a, b), Hk, interleaved, pieces, seq, pos, slots, snap) == y[a:b]).all()
    assert (pieces[1] == whole[1]).all()


def _interleaved_batch(n0, n1):
    # two sequences' tokens in one batch, alternating runs of a few tokens (slots 2 and 0), as the scheduler
    # mixes a prompt's chunk with another sequence's decode steps
    order = [(0, i) for i in range(n0)] + [(1, i) for i in range(n1)]
    order.sort(key=lambda x: (x[1] // 3, x[0]))
    return order


@pytest.mark.parametrize("kernel", ["scan", "delta"])
def test_sequences_batched_give_each_alone_and_a_checkpoint_holds_the_state_after_its_token(kernel):
    rng = np.random.default_rng(3)
    n = (11, 7)
    if kernel == "scan":
        shape, make = (4, 2, 64, 32), (lambda T: _scan_inputs(rng, T, 2, 64, 32, 1))
        run = (lambda inp, st, seq, pos, slots, snap: _scan(inp, 1, st, seq, pos, slots, snap))
    else:
        shape, make = (4, 2, 32, 32), (lambda T: _delta_inputs(rng, T, 2, 1, 32))
        run = (lambda inp, st, seq, pos, slots, snap: _delta(inp, 1, False, st, seq, pos, slots, snap))
    alone_inputs = [make(m) for m in n]
    alone_inputs[1] = tuple(x if x.ndim == 2 else w for x, w in zip(*alone_inputs[::-1]))  # one layer's weights
    alone = []
    for inp, m in zip(alone_inputs, n):
        st = np.zeros(shape, np.float32)
        alone.append((run(inp, st, *_one_sequence(m)[:2], np.array([0], np.int64), _one_sequence(m)[2]), st[0].copy()))
    order = _interleaved_batch(*n)
    batch = tuple(np.stack([alone_inputs[s][k][i] for s, i in order]) if x.ndim == 2 else x
                  for k, x in enumerate(alone_inputs[0]))
    seq = np.array([s for s, _ in order], np.int64)
    pos = np.array([i for _, i in order], np.int64)
    snap = np.full(len(order), -1, np.int64)
    at = order.index((0, 4))
    snap[at] = 3  # a checkpoint of sequence 0 after its token 4, in slot 3
    st = np.zeros(shape, np.float32)
    y = run(batch, st, seq, pos, np.array([2, 0], np.int64), snap)
    for r, (s, i) in enumerate(order):
        assert (y[r] == alone[s][0][i]).all()
    assert (st[2] == alone[0][1]).all() and (st[0] == alone[1][1]).all()
    check = np.zeros(shape, np.float32)
    run(tuple(x[:5] if x.ndim == 2 else x for x in alone_inputs[0]), check, *_one_sequence(5)[:2],
        np.array([0], np.int64), _one_sequence(5)[2])
    assert (st[3] == check[0]).all()
