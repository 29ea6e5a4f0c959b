"""Integer vector operations: loads and stores of bytes, byte arithmetic, and the integer dot products
(u8 x s8 -> s16 pairs -> s32 on avx2, one vpdpbusd on vnni)."""

from gguf.quants import IQ4_NL
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .paths import ARM_PATHS, X86_PATHS, path_of
from .vec import _V8I32, _V16I16, _V32I8, _byte_ptr, _call, _splat, i8x32, i16x16, i32x8

# IQ4_NL's and IQ4_XS's non-linear grid: the signed value each 4-bit index stands for (gguf's table)
IQ4_GRID = tuple(int(v) for v in IQ4_NL.kvalues)

@intrinsic
def ld(typingctx, a, i):
    """a.flat[i] of a C-contiguous array, with no negative-index wraparound (plain pointer arithmetic)."""
    sig = a.dtype(a, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]]))

    return sig, codegen


@intrinsic
def load32(typingctx, a, offset):
    """a[offset : offset + 32] -> i8x32 (vmovdqu); `a` is a C-contiguous uint8 or int8 array, offset in bytes."""
    sig = i8x32(a, types.intp)

    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, _V32I8.as_pointer()), align=1)

    return sig, codegen


@intrinsic
def prefetch(typingctx, a, offset):
    """Hint that a[offset] (a byte offset) will be read soon (prefetcht0); no effect on results."""
    sig = types.void(a, types.intp)

    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch256(typingctx, a, offset):
    """prefetch for the four 64-byte lines from a[offset] (a byte offset): a Q4_K/Q5_K sub-block pair's
    eight weight vectors."""
    sig = types.void(a, types.intp)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = None
        for line in range(4):
            off = builder.add(args[1], ir.Constant(args[1].type, 64 * line))
            p = _byte_ptr(context, builder, signature.args[0], args[0], off)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32]),
                                                "llvm.prefetch.p0")
            builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def widen8(typingctx, a, offset):
    """8 bytes at a[offset] (uint8) zero-extended -> s32x8 (vpmovzxbd)."""
    sig = i32x8(a, types.intp)

    def codegen(context, builder, signature, args):
        v8 = ir.VectorType(ir.IntType(8), 8)
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.zext(builder.load(builder.bitcast(p, v8.as_pointer()), align=1), _V8I32)

    return sig, codegen


@intrinsic
def widen8s(typingctx, a, offset):
    """8 bytes at a[offset] (int8 bit patterns in a uint8 array) sign-extended -> s32x8 (vpmovsxbd)."""
    sig = i32x8(a, types.intp)

    def codegen(context, builder, signature, args):
        v8 = ir.VectorType(ir.IntType(8), 8)
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.sext(builder.load(builder.bitcast(p, v8.as_pointer()), align=1), _V8I32)

    return sig, codegen


@intrinsic
def bcast4(typingctx, a, offset):
    """The 4 bytes at a[offset] (a byte offset) repeated 8 times -> i8x32 (vpbroadcastd)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        v = _splat(builder, builder.load(builder.bitcast(p, i32.as_pointer()), align=1), _V8I32)
        return builder.bitcast(v, _V32I8)

    return i8x32(a, types.intp), codegen


@intrinsic
def store32(typingctx, a, offset, v):
    """a[offset : offset + 32] = v (i8x32), a uint8 array, offset in bytes."""
    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, _V32I8.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(a, types.intp, i8x32), codegen


@intrinsic
def copy_bytes(typingctx, dst, doff, src, soff, n):
    """dst[doff : doff + n] = src[soff : soff + n] for n a constant 2 or 4: one unaligned move (byte offsets
    into two arrays, any dtype)."""
    if not isinstance(n, types.IntegerLiteral) or n.literal_value not in (2, 4):
        return None
    width = ir.IntType(8 * n.literal_value)

    def codegen(context, builder, signature, args):
        sp = builder.bitcast(_byte_ptr(context, builder, signature.args[2], args[2], args[3]), width.as_pointer())
        dp = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]), width.as_pointer())
        builder.store(builder.load(sp, align=1), dp, align=1)
        return context.get_dummy_value()

    return types.void(dst, types.intp, src, types.intp, n), codegen


@intrinsic
def or_(typingctx, a, b):
    """a | b, i8x32 (vpor)."""
    return i8x32(i8x32, i8x32), lambda c, builder, s, args: builder.or_(args[0], args[1])


@intrinsic
def shr4(typingctx, a):
    """(a >> 4) & 15 per byte, i8x32 (vpsrlw + vpand)."""
    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], ir.Constant(_V32I8, [4] * 32))

    return i8x32(i8x32), codegen


@intrinsic
def low4(typingctx, a):
    """a & 15 per byte, i8x32."""
    return i8x32(i8x32), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V32I8, [15] * 32))


def _bits_at(mask, up):
    # the codegen of ((a >> i) & mask) << up per byte of an i8x32, i a runtime shift (vpsrlw + vpand [+ vpsllw])
    def codegen(context, builder, signature, args):
        sh = builder.trunc(args[1], ir.IntType(8))
        v = builder.and_(builder.lshr(args[0], _splat(builder, sh, _V32I8)), ir.Constant(_V32I8, [mask] * 32))
        return builder.shl(v, ir.Constant(_V32I8, [up] * 32)) if up else v

    return codegen


@intrinsic
def bit_to_16(typingctx, a, i):
    """((a >> i) & 1) << 4 per byte, i8x32: the fifth bit of a Q5_K weight from its qh byte."""
    return i8x32(i8x32, types.intp), _bits_at(1, 4)


@intrinsic
def bits2(typingctx, a, i):
    """(a >> i) & 3 per byte, i8x32: the two-bit value of a Q3_K/Q2_K weight at bit i of its plane byte."""
    return i8x32(i8x32, types.intp), _bits_at(3, 0)


@intrinsic
def bit_to_4(typingctx, a, i):
    """((a >> i) & 1) << 2 per byte, i8x32: the third bit of a Q3_K weight (hmask's) from its plane byte."""
    return i8x32(i8x32, types.intp), _bits_at(1, 2)


@intrinsic
def low4_16(typingctx, a):
    """a & 15 per 16-bit lane (s16x16): Q2_K's scale from its scale | min << 4 byte."""
    return i16x16(i16x16), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V16I16, [15] * 16))


@intrinsic
def high4_16(typingctx, a):
    """a >> 4 per 16-bit lane (s16x16, a below 256): Q2_K's min from its scale | min << 4 byte."""
    return i16x16(i16x16), lambda c, builder, s, args: builder.lshr(args[0], ir.Constant(_V16I16, [4] * 16))


@intrinsic
def low4_32(typingctx, a):
    """a & 15 per 32-bit lane (s32x8)."""
    return i32x8(i32x8), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V8I32, [15] * 8))


@intrinsic
def high4_32(typingctx, a):
    """a >> 4 per 32-bit lane (s32x8, a below 256)."""
    return i32x8(i32x8), lambda c, builder, s, args: builder.lshr(args[0], ir.Constant(_V8I32, [4] * 8))


def _grid16(bias):
    def typer(typingctx, isa, a):
        path = path_of(isa)
        if path not in X86_PATHS + ARM_PATHS:
            return None
        v16 = ir.VectorType(ir.IntType(8), 16)
        table = [(v + bias) & 255 for v in IQ4_GRID]

        def codegen(context, builder, signature, args):
            a = args[1]
            if path in X86_PATHS:
                return _call(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [ir.Constant(_V32I8, table * 2), a])
            grid = ir.Constant(v16, table)
            lanes = ir.IntType(32)
            halves = [_call(builder, "llvm.aarch64.neon.tbl1.v16i8", v16,
                            [grid, builder.shuffle_vector(a, a, ir.Constant(ir.VectorType(lanes, 16), list(range(h, h + 16))))])
                      for h in (0, 16)]
            return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(lanes, 32), list(range(32))))

        return i8x32(isa, i8x32), codegen
    return typer


grid16 = intrinsic(_grid16(0))
grid16.__doc__ = """IQ4_GRID[a] per byte, i8x32, for indices a in 0..15: one vpshufb on x86 (the grid in both 128-bit
lanes), a tbl per 16-byte half on aarch64. Not on the portable path (its kernels index the grid)."""
grid16u = intrinsic(_grid16(128))
grid16u.__doc__ = """IQ4_GRID[a] + 128 per byte (unsigned, 1..241), i8x32, as grid16: the grid as the unsigned operand of
vpdpbusd, whose sums are then 128 times the activations' sum too many."""


@intrinsic
def abs8(typingctx, a):
    """|a| per signed byte, i8x32 (vpabsb)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.abs.v32i8", _V32I8, [args[0], ir.Constant(ir.IntType(1), 0)])

    return i8x32(i8x32), codegen


@intrinsic
def sign8(typingctx, a, b):
    """a with the sign of b per byte (0 where b is 0), i8x32 (vpsignb)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx2.psign.b", _V32I8, list(args))

    return i8x32(i8x32, i8x32), codegen


@intrinsic
def maddubs(typingctx, a, b):
    """u8x32 * s8x32 -> s16x16, adjacent pairs summed with saturation (vpmaddubsw)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, list(args))

    return i16x16(i8x32, i8x32), codegen


@intrinsic
def madd(typingctx, a, b):
    """s16x16 * s16x16 -> s32x8, adjacent pairs summed (vpmaddwd)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, list(args))

    return i32x8(i16x16, i16x16), codegen


@intrinsic
def ones16(typingctx):
    """s16x16 of ones (the second operand of mul_sum_us8_pairs' vpmaddwd)."""
    return i16x16(), lambda c, builder, s, args: ir.Constant(_V16I16, [1] * 16)


@intrinsic
def dpbusd(typingctx, acc, a, b):
    """acc + u8x32 . s8x32 in groups of 4 bytes -> s32x8, no saturation (vpdpbusd, AVX-512 VNNI/VL or AVX-VNNI)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [args[0],
                     builder.bitcast(args[1], _V8I32), builder.bitcast(args[2], _V8I32)])

    return i32x8(i32x8, i8x32, i8x32), codegen


@intrinsic
def add16(typingctx, a, b):
    """a + b, s16x16 (vpaddw; the callers keep the sums in range)."""
    return i16x16(i16x16, i16x16), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def add32(typingctx, a, b):
    """a + b, s32x8 (vpaddd)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def sub32(typingctx, a, b):
    """a - b, s32x8 (vpsubd)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.sub(args[0], args[1])


@intrinsic
def mul32(typingctx, a, b):
    """a * b, s32x8, low 32 bits (vpmulld)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.mul(args[0], args[1])


@intrinsic
def splat32(typingctx, x):
    """s32x8 with the integer x in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.int32), _V8I32)

    return i32x8(x), codegen


@intrinsic
def zero32(typingctx):
    """s32x8 of zeros."""
    return i32x8(), lambda c, builder, s, args: ir.Constant(_V8I32, None)


def _load_bytes(context, builder, aryty, ary, offset, n):
    p = _byte_ptr(context, builder, aryty, ary, offset)
    return builder.load(builder.bitcast(p, ir.VectorType(ir.IntType(8), n).as_pointer()), align=1)


def _widen_shuffled(n, order, signed):
    # n bytes at a[offset] widened to 16 bits (sign- or zero-extended), then placed in the order `order`
    def codegen(context, builder, signature, args):
        v = _load_bytes(context, builder, signature.args[0], args[0], args[1], n)
        v = builder.sext(v, ir.VectorType(ir.IntType(16), n)) if signed else builder.zext(v, ir.VectorType(ir.IntType(16), n))
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), 16), order))

    return codegen


_DOUBLED = [i // 2 for i in range(16)]            # byte r into both halves of lane r
_PAIRED = [i // 2 + 8 * (i % 2) for i in range(16)]  # byte r of two groups of 8 into the halves of lane r


@intrinsic
def scales16(typingctx, a, offset):
    """8 bytes at a[offset] (uint8), each zero-extended into both 16-bit halves of its 32-bit lane -> s16x16
    (vpmovzxbw + vpunpcklwd): the second operand of a vpmaddwd that applies row r's sub-block scale to
    the row's two 16-bit partial sums in lane r."""
    return i16x16(a, types.intp), _widen_shuffled(8, _DOUBLED, False)


@intrinsic
def scales16s(typingctx, a, offset):
    """As scales16, the bytes sign-extended (int8 bit patterns: Q6_K's scales)."""
    return i16x16(a, types.intp), _widen_shuffled(8, _DOUBLED, True)


@intrinsic
def pairs16(typingctx, a, offset):
    """16 bytes at a[offset] (uint8), two groups of 8: lane r holds byte r of the first group in its low 16
    bits and byte r of the second in its high 16 bits, zero-extended -> s16x16 (vpmovzxbw + a word
    shuffle). With splat_pair16(x0, x1), one vpmaddwd gives lane r a0_r * x0 + a1_r * x1."""
    return i16x16(a, types.intp), _widen_shuffled(16, _PAIRED, False)


@intrinsic
def pairs16s(typingctx, a, offset):
    """As pairs16, the bytes sign-extended (int8 bit patterns)."""
    return i16x16(a, types.intp), _widen_shuffled(16, _PAIRED, True)


@intrinsic
def splat_pair16(typingctx, x0, x1):
    """s16x16 of (x0, x1) repeated: two integers in [-32768, 32767], x0 in the low half of every 32-bit lane."""
    def codegen(context, builder, signature, args):
        i16, i32 = ir.IntType(16), ir.IntType(32)
        lo = builder.zext(builder.trunc(context.cast(builder, args[0], signature.args[0], types.int32), i16), i32)
        hi = builder.zext(builder.trunc(context.cast(builder, args[1], signature.args[1], types.int32), i16), i32)
        word = builder.or_(lo, builder.shl(hi, ir.Constant(i32, 16)))
        return builder.bitcast(_splat(builder, word, _V8I32), _V16I16)

    return i16x16(x0, x1), codegen


@intrinsic
def load8i(typingctx, a, i):
    """a.flat[i : i + 8] -> s32x8, an int32 array."""
    def codegen(context, builder, signature, args):
        p = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load(builder.bitcast(builder.gep(p, [args[1]]), _V8I32.as_pointer()), align=4)

    return i32x8(a, types.intp), codegen


@intrinsic
def store8i(typingctx, a, i, v):
    """a.flat[i : i + 8] = v (s32x8), an int32 array."""
    def codegen(context, builder, signature, args):
        p = context.make_array(signature.args[0])(context, builder, args[0]).data
        builder.store(args[2], builder.bitcast(builder.gep(p, [args[1]]), _V8I32.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(a, types.intp, i32x8), codegen
