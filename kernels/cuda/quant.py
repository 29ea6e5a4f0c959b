"""CUDA kernels over the repacked weights (quant/repack.py's row-major layout of every kind): the decode
of one element (each weight format's, kernels/formats), and the matmuls and embedding lookups built on it
(one thread per output element).
The CPU backend's twin is kernels/cpu/quant.py."""

from numba import cuda, float32

from .. import formats, kinds

# _dq(kind, qs, qh, sc, d, m, luts, n, k): element k of row n of W, for every row-major kind: each weight
# format's decode (kernels/formats: `element`) as a device function, behind a dispatch on the kind generated
# from the registry (`_dq.py_func.source`)
_ELEMENTS = {mod: cuda.jit(device=True)(mod.element) for mod in formats.MODULES}
_dq = cuda.jit(device=True)(formats.dispatch("_dq", "kind, qs, qh, sc, d, m, luts, n, k", _ELEMENTS,
                                             [k.id for k in kinds.KINDS if not k.interleaved], returns=True))


@cuda.jit
def matmul_q(kind, qs, qh, sc, d, m, luts, x, out):
    # W (N,K) @ x (T,K) -> out (T,N); one thread per output element
    n, t = cuda.grid(2)
    if n < out.shape[1] and t < out.shape[0]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += _dq(kind, qs, qh, sc, d, m, luts, n, k) * x[t, k]
        out[t, n] = acc


@cuda.jit
def matmul_f32(w, x, out):
    n, t = cuda.grid(2)
    if n < out.shape[1] and t < out.shape[0]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += w[n, k] * x[t, k]
        out[t, n] = acc


@cuda.jit
def embed_q(kind, qs, qh, sc, d, m, luts, ids, out):
    i, k = cuda.grid(2)
    if i < out.shape[0] and k < out.shape[1]:
        out[i, k] = _dq(kind, qs, qh, sc, d, m, luts, ids[i], k)


@cuda.jit
def embed_f32(w, ids, out):
    i, k = cuda.grid(2)
    if i < out.shape[0] and k < out.shape[1]:
        out[i, k] = w[ids[i], k]
