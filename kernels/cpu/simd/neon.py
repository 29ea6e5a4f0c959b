"""aarch64 integer dot products: the neon, dotprod and i8mm paths' operations.

The interleaved layouts (kernels/cpu/layout.py) keep four consecutive elements of eight rows in one
32-byte vector, row r in bytes 4r .. 4r + 3. On aarch64 such a vector is two 128-bit registers (rows 0-3,
rows 4-7), and each of the operations here works on both halves:

- ``sdot``: four signed bytes times four signed bytes summed into each 32-bit lane (ARMv8.2 dotprod):
  exactly the lane shape of the layout, one instruction per register where x86 needs vpmaddubsw and
  vpmaddwd (or one vpdpbusd). Signed on both sides: every weight the layouts hold as unsigned bytes is
  below 128 (Q4 nibbles 15, Q5 31, Q6_K 63), so s8 x s8 gives the same products as x86's u8 x s8, and
  Q8_0 needs no sign trick;
- ``mull16`` / ``sum4x16``: baseline ARMv8-A (no dotprod) products of bytes widened to 16 bits
  (smull/smlal), summed over several vectors while they fit, then each lane's four 16-bit sums widened
  and added (saddlp + addp);
- ``mmla8`` / ``mmla4``: i8mm's smmla, a 2x8 by 8x2 signed byte product into a 2x2 block of 32-bit sums,
  for two tokens at once: pairs of the layout's vectors are zipped (by 32-bit words) into two rows of eight
  consecutive elements, two tokens' eight activation bytes are zipped (by 64-bit words) beside each
  other, and four smmla per pair of rows give both tokens' sums for a 32-element block (half the
  instructions of sdot). The zips of the weights do not depend on the token, so in a loop over token pairs
  they are computed once per block.

Each takes and gives the vector types of vec.py, so the kernels written for x86's 32-byte vectors call
them unchanged; every sum is the exact integer, so each path gives the portable path's bits.
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .vec import _V8I32, Vec, _byte_ptr, _call, i8x32, i32x8

i16x32 = Vec("i16", 32)  # the 16-bit products of two i8x32, lane by lane
i32x16 = Vec("i32", 16)  # two tokens' eight 32-bit sums (mmla8, mmla4): token a in lanes 0-7, b in 8-15
_V32I16 = i16x32.llvm_type()
_V16I32 = i32x16.llvm_type()
_V16I8 = ir.VectorType(ir.IntType(8), 16)
_V8I16 = ir.VectorType(ir.IntType(16), 8)
_V4I32 = ir.VectorType(ir.IntType(32), 4)


def _idx(xs):
    return ir.Constant(ir.VectorType(ir.IntType(32), len(xs)), list(xs))


def _part(builder, v, start, n):
    # lanes [start, start + n) of v (a shuffle LLVM folds into register naming)
    return builder.shuffle_vector(v, v, _idx(range(start, start + n)))


def _join(builder, a, b):
    return builder.shuffle_vector(a, b, _idx(range(2 * a.type.count)))


@intrinsic
def sdot(typingctx, acc, a, b):
    """acc + s8x32 a . s8x32 b in groups of 4 bytes -> s32x8, exact (two `sdot v.4s, v.16b, v.16b`)."""
    def codegen(context, builder, signature, args):
        acc, a, b = args
        halves = [_call(builder, "llvm.aarch64.neon.sdot.v4i32.v16i8", _V4I32,
                        [_part(builder, acc, 4 * h, 4), _part(builder, a, 16 * h, 16), _part(builder, b, 16 * h, 16)])
                  for h in range(2)]
        return _join(builder, *halves)

    return i32x8(i32x8, i8x32, i8x32), codegen


@intrinsic
def mull16(typingctx, a, b):
    """s8x32 a * s8x32 b -> s16x32, each product widened to 16 bits (four `smull`/`smull2`)."""
    def codegen(context, builder, signature, args):
        a, b = args
        prods = [_call(builder, "llvm.aarch64.neon.smull.v8i16", _V8I16,
                       [_part(builder, a, 8 * q, 8), _part(builder, b, 8 * q, 8)]) for q in range(4)]
        return _join(builder, _join(builder, prods[0], prods[1]), _join(builder, prods[2], prods[3]))

    return i16x32(i8x32, i8x32), codegen


@intrinsic
def add16x32(typingctx, a, b):
    """a + b, s16x32 (`add v.8h`; after mull16 LLVM folds it into `smlal`); the callers keep the sums in
    range."""
    return i16x32(i16x32, i16x32), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def sum4x16(typingctx, acc, p):
    """acc + the sums of each four consecutive 16-bit lanes of p, widened -> s32x8: lane r gets p's lanes
    4r .. 4r + 3, row r's products in the layout (`saddlp` twice per register, then `addp`)."""
    def codegen(context, builder, signature, args):
        acc, p = args
        out = []
        for h in range(2):  # rows 0-3, rows 4-7
            lo = _call(builder, "llvm.aarch64.neon.saddlp.v4i32.v8i16", _V4I32, [_part(builder, p, 16 * h, 8)])
            hi = _call(builder, "llvm.aarch64.neon.saddlp.v4i32.v8i16", _V4I32, [_part(builder, p, 16 * h + 8, 8)])
            out.append(_call(builder, "llvm.aarch64.neon.addp.v4i32", _V4I32, [lo, hi]))
        return builder.add(acc, _join(builder, *out))

    return i32x8(i32x8, i16x32), codegen


def _mmla(nvec):
    # the codegen of mmla8 / mmla4: nvec weight vectors (nvec / 2 octets of elements), tokens at byte
    # offsets oa and ob of xq
    def codegen(context, builder, signature, args):
        ws = [builder.bitcast(w, _V8I32) for w in args[:nvec]]
        xq_ty, xq, oa, ob = signature.args[nvec], args[nvec], args[nvec + 1], args[nvec + 2]
        span = ir.VectorType(ir.IntType(64), nvec // 2)  # a token's 4 * nvec bytes as 64-bit words
        xa = builder.load(builder.bitcast(_byte_ptr(context, builder, xq_ty, xq, oa), span.as_pointer()), align=1)
        xb = builder.load(builder.bitcast(_byte_ptr(context, builder, xq_ty, xq, ob), span.as_pointer()), align=1)
        accs = []
        for p in range(4):  # rows 2p, 2p + 1
            acc = ir.Constant(_V4I32, None)
            for k in range(nvec // 2):  # elements 8k .. 8k + 7
                # [row 2p elements 8k..8k+7, row 2p + 1 elements 8k..8k+7] (zip1/zip2 .4s)
                w = builder.bitcast(builder.shuffle_vector(ws[2 * k], ws[2 * k + 1], _idx([2 * p, 8 + 2 * p, 2 * p + 1, 9 + 2 * p])), _V16I8)
                # [token a elements 8k..8k+7, token b elements 8k..8k+7] (zip1 .2d)
                x = builder.bitcast(builder.shuffle_vector(xa, xb, _idx([k, nvec // 2 + k])), _V16I8)
                acc = _call(builder, "llvm.aarch64.neon.smmla.v4i32.v16i8", _V4I32, [acc, w, x])
            accs.append(acc)  # [row 2p . a, row 2p . b, row 2p+1 . a, row 2p+1 . b]
        lo = _join(builder, accs[0], accs[1])
        hi = _join(builder, accs[2], accs[3])
        # token a: lanes 0, 2 of each block; token b: lanes 1, 3 (uzp1/uzp2)
        return builder.shuffle_vector(lo, hi, _idx([0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]))

    return codegen


@intrinsic
def mmla8(typingctx, w0, w1, w2, w3, w4, w5, w6, w7, xq, oa, ob):
    """Eight layout vectors (32 elements of eight rows, signed bytes) times the 32 activation bytes of two
    tokens, xq[oa : oa + 32] and xq[ob : ob + 32] -> s32x16 (token a's eight rows, then b's), exact: 16
    `smmla`."""
    return i32x16(*([i8x32] * 8), xq, types.intp, types.intp), _mmla(8)


@intrinsic
def mmla4(typingctx, w0, w1, w2, w3, xq, oa, ob):
    """As mmla8 for four vectors (16 elements of eight rows: Q6_K's scale groups): 8 `smmla`."""
    return i32x16(*([i8x32] * 4), xq, types.intp, types.intp), _mmla(4)


@intrinsic
def token_a(typingctx, v):
    """Lanes 0-7 of an s32x16 from mmla8/mmla4: the first token's sums."""
    return i32x8(i32x16), lambda c, builder, s, args: _part(builder, args[0], 0, 8)


@intrinsic
def token_b(typingctx, v):
    """Lanes 8-15 of an s32x16 from mmla8/mmla4: the second token's sums."""
    return i32x8(i32x16), lambda c, builder, s, args: _part(builder, args[0], 8, 8)


__all__ = ["sdot", "mull16", "add16x32", "sum4x16", "mmla8", "mmla4", "token_a", "token_b", "i16x32", "i32x16"]
