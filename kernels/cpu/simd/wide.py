"""512-bit operations for the avx512 path: one zmm register holds two interleaved groups of eight rows (16
output rows), so each activation broadcast and each vpdpbusd does twice the work of the vnni path's ymm.

A wide vector is two 32-byte halves: the low one from group g, the high one from group g + 1 (two loads,
load32x2; LLVM folds the second into a vinserti64x4), with the same lane shapes as the ymm vectors, so
the 16 rows' integer sums, and every float operation on them, are the ymm path's lane for lane: the same
bits. AVX-512 has no vpsignb, so signed weights enter vpdpbusd as w + 128 (unsigned, flip8w) and the
kernels subtract 128 times each activation block's sum."""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .ints import IQ4_GRID
from .vec import Vec, _byte_ptr, _call, _elem_ptr, _splat

i8x64 = Vec("i8", 64)
i32x16 = Vec("i32", 16)
f32x16 = Vec("f32", 16)
_V64I8 = i8x64.llvm_type()
_V16I32 = i32x16.llvm_type()
_V16F32 = f32x16.llvm_type()
_V32I8 = ir.VectorType(ir.IntType(8), 32)
_LANES = ir.IntType(32)


def _concat(builder, lo, hi):
    n = lo.type.count
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_LANES, 2 * n), list(range(2 * n))))


@intrinsic
def load32x2(typingctx, a, o0, o1):
    """a[o0 : o0 + 32] and a[o1 : o1 + 32] as one i8x64 (vmovdqu + vinserti64x4), offsets in bytes."""
    def codegen(context, builder, signature, args):
        halves = [builder.load(builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], o), _V32I8.as_pointer()),
                               align=1) for o in (args[1], args[2])]
        return _concat(builder, *halves)

    return i8x64(a, types.intp, types.intp), codegen


@intrinsic
def bcast4w(typingctx, a, offset):
    """The 4 bytes at a[offset] repeated 16 times -> i8x64 (vpbroadcastd zmm)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.bitcast(_splat(builder, builder.load(builder.bitcast(p, i32.as_pointer()), align=1), _V16I32), _V64I8)

    return i8x64(a, types.intp), codegen


@intrinsic
def low4w(typingctx, a):
    """a & 15 per byte, i8x64."""
    return i8x64(i8x64), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V64I8, [15] * 64))


@intrinsic
def shr4w(typingctx, a):
    """(a >> 4) per byte, i8x64 (vpsrlw + vpand)."""
    return i8x64(i8x64), lambda c, builder, s, args: builder.lshr(args[0], ir.Constant(_V64I8, [4] * 64))


@intrinsic
def flip8w(typingctx, a):
    """a + 128 per signed byte (a ^ 0x80), i8x64: a signed weight as vpdpbusd's unsigned operand."""
    return i8x64(i8x64), lambda c, builder, s, args: builder.xor(args[0], ir.Constant(_V64I8, [128] * 64))


@intrinsic
def grid16uw(typingctx, a):
    """IQ4_GRID[a] + 128 per byte for indices 0..15, i8x64: one vpshufb zmm, the grid in every 128-bit lane."""
    table = [(v + 128) & 255 for v in IQ4_GRID] * 4

    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx512.pshuf.b.512", _V64I8, [ir.Constant(_V64I8, table), args[0]])

    return i8x64(i8x64), codegen


@intrinsic
def dpbusdw(typingctx, acc, a, b):
    """acc + u8x64 . s8x64 in groups of 4 bytes -> s32x16, no saturation (vpdpbusd zmm)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [args[0], builder.bitcast(args[1], _V16I32),
                                                                        builder.bitcast(args[2], _V16I32)])

    return i32x16(i32x16, i8x64, i8x64), codegen


@intrinsic
def zero32w(typingctx):
    """s32x16 of zeros."""
    return i32x16(), lambda c, builder, s, args: ir.Constant(_V16I32, None)


@intrinsic
def add32w(typingctx, a, b):
    """a + b, s32x16."""
    return i32x16(i32x16, i32x16), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def sub32w(typingctx, a, b):
    """a - b, s32x16."""
    return i32x16(i32x16, i32x16), lambda c, builder, s, args: builder.sub(args[0], args[1])


@intrinsic
def splat32w(typingctx, x):
    """s32x16 with the integer x in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.int32), _V16I32)

    return i32x16(x), codegen


@intrinsic
def cvt16(typingctx, a):
    """s32x16 -> f32x16 (vcvtdq2ps; exact below 2**24)."""
    return f32x16(i32x16), lambda c, builder, s, args: builder.sitofp(args[0], _V16F32)


@intrinsic
def loadf8x2(typingctx, a, i0, i1):
    """a.flat[i0 : i0 + 8] and a.flat[i1 : i1 + 8] as one f32x16: float32 values, or float16 bit patterns
    (uint16) widened (vcvtph2ps)."""
    if a.dtype == types.float32:
        elem, align = ir.VectorType(ir.FloatType(), 8), 4
    elif a.dtype == types.uint16:
        elem, align = ir.VectorType(ir.HalfType(), 8), 2
    else:
        return None

    def codegen(context, builder, signature, args):
        halves = [builder.load(_elem_ptr(context, builder, signature.args[0], args[0], i, elem), align=align)
                  for i in (args[1], args[2])]
        v = _concat(builder, *halves)
        return v if a.dtype == types.float32 else builder.fpext(v, _V16F32)

    return f32x16(a, types.intp, types.intp), codegen


@intrinsic
def loadf16(typingctx, a, i):
    """a.flat[i : i + 16] -> f32x16, a float32 array."""
    def codegen(context, builder, signature, args):
        return builder.load(_elem_ptr(context, builder, signature.args[0], args[0], args[1], _V16F32), align=4)

    return f32x16(a, types.intp), codegen


@intrinsic
def storef16(typingctx, a, i, v):
    """a.flat[i : i + 16] = v, a float32 array."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], _elem_ptr(context, builder, signature.args[0], args[0], args[1], _V16F32), align=4)
        return context.get_dummy_value()

    return types.void(a, types.intp, f32x16), codegen


@intrinsic
def splatf16(typingctx, x):
    """f32x16 with x in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.float32), _V16F32)

    return f32x16(x), codegen


@intrinsic
def fma16(typingctx, a, b, c):
    """a * b + c, f32x16, one rounding (vfmadd zmm)."""
    return f32x16(f32x16, f32x16, f32x16), lambda ctx, builder, s, args: _call(builder, "llvm.fma.v16f32", _V16F32, list(args))


@intrinsic
def mul16(typingctx, a, b):
    """a * b, f32x16."""
    return f32x16(f32x16, f32x16), lambda ctx, builder, s, args: builder.fmul(args[0], args[1])


@intrinsic
def storef16_first(typingctx, a, i, v, n):
    """a.flat[i : i + min(n, 16)] = the first n lanes of v (n >= 1), a float32 array: one store where n >= 16,
    a masked store (AVX-512's k-mask) otherwise. An intrinsic, so the loops pay no reference counting."""
    def codegen(context, builder, signature, args):
        ptr = _elem_ptr(context, builder, signature.args[0], args[0], args[1], _V16F32)
        count = context.cast(builder, args[3], signature.args[3], types.int64)
        i64 = ir.IntType(64)
        with builder.if_else(builder.icmp_signed(">=", count, ir.Constant(i64, 16))) as (full, part):
            with full:
                builder.store(args[2], ptr, align=4)
            with part:
                lanes = ir.Constant(ir.VectorType(i64, 16), list(range(16)))
                mask = builder.icmp_signed("<", lanes, _splat(builder, count, ir.VectorType(i64, 16)))
                _call(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(),
                      [args[2], ptr, ir.Constant(ir.IntType(32), 4), mask])
        return context.get_dummy_value()

    return types.void(a, types.intp, f32x16, n), codegen


@intrinsic
def or_w(typingctx, a, b):
    """a | b, i8x64."""
    return i8x64(i8x64, i8x64), lambda c, builder, s, args: builder.or_(args[0], args[1])


def _bits_at_w(mask, up):
    # ((a >> i) & mask) << up per byte of an i8x64, i a runtime shift (ints._bits_at on zmm)
    def codegen(context, builder, signature, args):
        v = builder.lshr(args[0], _splat(builder, builder.trunc(args[1], ir.IntType(8)), _V64I8))
        v = builder.and_(v, ir.Constant(_V64I8, [mask] * 64))
        return builder.shl(v, ir.Constant(_V64I8, [up] * 64)) if up else v

    return codegen


@intrinsic
def bit_to_16w(typingctx, a, i):
    """((a >> i) & 1) << 4 per byte, i8x64: the fifth bit of a Q5_K weight from its qh byte."""
    return i8x64(i8x64, types.intp), _bits_at_w(1, 4)


@intrinsic
def bits2w(typingctx, a, i):
    """(a >> i) & 3 per byte, i8x64: two groups' two-bit Q3_K/Q2_K values at bit i of their plane bytes."""
    return i8x64(i8x64, types.intp), _bits_at_w(3, 0)


@intrinsic
def bit_to_4w(typingctx, a, i):
    """((a >> i) & 1) << 2 per byte, i8x64: the third bit of two groups' Q3_K weights (hmask's)."""
    return i8x64(i8x64, types.intp), _bits_at_w(1, 2)


@intrinsic
def low4x2w(typingctx, a):
    """a & 0x000F000F per 32-bit lane (s32x16): the low nibble of each 16-bit half, so of a pairs16x2
    operand's two bytes, or of a widen8x2 lane (Q2_K's scale from its scale | min << 4 byte)."""
    return i32x16(i32x16), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V16I32, [0x000F000F] * 16))


@intrinsic
def high4x2w(typingctx, a):
    """(a >> 4) & 0x000F000F per 32-bit lane (s32x16; each 16-bit half below 256): the high nibbles of a
    pairs16x2 operand's two bytes (Q2_K's mins)."""
    def codegen(context, builder, signature, args):
        return builder.and_(builder.lshr(args[0], ir.Constant(_V16I32, [4] * 16)), ir.Constant(_V16I32, [0x000F000F] * 16))

    return i32x16(i32x16), codegen


def _widen8x2(signed):
    def codegen(context, builder, signature, args):
        v8 = ir.VectorType(ir.IntType(8), 8)
        halves = [builder.load(builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], o), v8.as_pointer()),
                               align=1) for o in (args[1], args[2])]
        v = _concat(builder, *halves)
        return builder.sext(v, _V16I32) if signed else builder.zext(v, _V16I32)

    return codegen


@intrinsic
def widen8x2(typingctx, a, o0, o1):
    """8 bytes at a[o0] and 8 at a[o1] (uint8) zero-extended -> s32x16 (two groups' sub-block scales)."""
    return i32x16(a, types.intp, types.intp), _widen8x2(False)


@intrinsic
def widen8x2s(typingctx, a, o0, o1):
    """As widen8x2, the bytes sign-extended (int8 bit patterns: Q6_K's scales)."""
    return i32x16(a, types.intp, types.intp), _widen8x2(True)


def _pairs16x2(signed):
    # lane r (0..7: group g's 16 bytes at o0, 8..15: group g + 1's at o1): byte r of the first 8 in the low
    # 16 bits, byte r of the second 8 in the high 16 bits
    order = [i // 2 + 8 * (i % 2) for i in range(16)]
    order = order + [16 + k for k in order]

    def codegen(context, builder, signature, args):
        v16 = ir.VectorType(ir.IntType(8), 16)
        halves = [builder.load(builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], o), v16.as_pointer()),
                               align=1) for o in (args[1], args[2])]
        v = _concat(builder, *halves)
        w = ir.VectorType(ir.IntType(16), 32)
        v = builder.sext(v, w) if signed else builder.zext(v, w)
        return builder.bitcast(builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_LANES, 32), order)), _V16I32)

    return codegen


@intrinsic
def pairs16x2(typingctx, a, o0, o1):
    """Two groups' 16 bytes (two sub-blocks of eight rows each) as 16-bit pairs in 32-bit lanes, zero-extended,
    -> s32x16 holding s16x32: the weight-side operand of dpwssdw."""
    return i32x16(a, types.intp, types.intp), _pairs16x2(False)


@intrinsic
def pairs16x2s(typingctx, a, o0, o1):
    """As pairs16x2, the bytes sign-extended (Q6_K's scales)."""
    return i32x16(a, types.intp, types.intp), _pairs16x2(True)


@intrinsic
def dpwssdw(typingctx, acc, a, b):
    """acc + s16x32 . s16x32 in pairs -> s32x16, no saturation (vpdpwssd zmm); a and b hold the 16-bit pairs
    in 32-bit lanes."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx512.vpdpwssd.512", _V16I32, list(args))

    return i32x16(i32x16, i32x16, i32x16), codegen


@intrinsic
def mul32w(typingctx, a, b):
    """a * b, s32x16, low 32 bits (vpmulld zmm)."""
    return i32x16(i32x16, i32x16), lambda c, builder, s, args: builder.mul(args[0], args[1])


@intrinsic
def shl32w(typingctx, a, n):
    """a << n, s32x16 (a constant shift count: vpslld)."""
    def codegen(context, builder, signature, args):
        return builder.shl(args[0], _splat(builder, builder.trunc(args[1], ir.IntType(32)), _V16I32))

    return i32x16(i32x16, types.intp), codegen


@intrinsic
def load16i(typingctx, a, i):
    """a.flat[i : i + 16] -> s32x16, an int32 array."""
    def codegen(context, builder, signature, args):
        return builder.load(_elem_ptr(context, builder, signature.args[0], args[0], args[1], _V16I32), align=4)

    return i32x16(a, types.intp), codegen


@intrinsic
def store16i(typingctx, a, i, v):
    """a.flat[i : i + 16] = v (s32x16), an int32 array."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], _elem_ptr(context, builder, signature.args[0], args[0], args[1], _V16I32), align=4)
        return context.get_dummy_value()

    return types.void(a, types.intp, i32x16), codegen


@intrinsic
def sub16(typingctx, a, b):
    """a - b, f32x16."""
    return f32x16(f32x16, f32x16), lambda ctx, builder, s, args: builder.fsub(args[0], args[1])
