"""Integer vector operations: loads and stores of bytes, byte arithmetic, and the integer dot products
(u8 x s8 -> s16 pairs -> s32 on avx2, one vpdpbusd on vnni and avx512). Those that take vectors take a
ymm or a zmm one (vec.py); the loads take one offset for a ymm vector, two (two row groups) for a zmm one."""

from gguf.quants import IQ4_NL, MXFP4
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .paths import ARM_PATHS, X86_PATHS, path_of
from .vec import (_V8I32, _V16I16, _V32I8, _binary, _byte_ptr, _call, _const, _instr, _load, _load_halves, _named,
                  _offsets, _splat, _store, i8x32, i8x64, i16x16, i32x8, i32x16, vec_of)

# IQ4_NL's and IQ4_XS's non-linear grid: the signed value each 4-bit index stands for (gguf's table)
IQ4_GRID = tuple(int(v) for v in IQ4_NL.kvalues)
# MXFP4's E2M1 values, doubled to integers (gguf's table): -12 .. 12
MX_GRID = tuple(int(v) for v in MXFP4.kvalues)

@intrinsic
def ld(typingctx, a, i):
    """a.flat[i] of a C-contiguous array, with no negative-index wraparound (plain pointer arithmetic)."""
    sig = a.dtype(a, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]]))

    return sig, codegen


def _offsets_sig(offsets):
    # the type of an operation's offsets (one or two, each cast to intp), or None for another count
    return types.StarArgTuple.from_types([types.intp] * len(offsets)) if len(offsets) in (1, 2) else None


@intrinsic
def load32(typingctx, a, *offsets):
    """a[o : o + 32] -> i8x32 (vmovdqu); `a` is a C-contiguous uint8 or int8 array, offsets in bytes. With two
    offsets o0, o1: both runs as one i8x64, o0's the low half (vmovdqu + vinserti64x4)."""
    n = len(offsets)
    if _offsets_sig(offsets) is None:
        return None

    def codegen(context, builder, signature, args):
        return _load_halves(context, builder, signature.args[0], args[0], _offsets(builder, args, n), _V32I8, 1)

    return (i8x32 if n == 1 else i8x64)(a, _offsets_sig(offsets)), codegen


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


def _widen8(signed):
    # 8 bytes at each offset, sign- or zero-extended to 32 bits: s32x8, or s32x16 from two offsets
    def typer(typingctx, a, *offsets):
        n = len(offsets)
        if _offsets_sig(offsets) is None:
            return None
        t = i32x8 if n == 1 else i32x16

        def codegen(context, builder, signature, args):
            v = _load_halves(context, builder, signature.args[0], args[0], _offsets(builder, args, n),
                             ir.VectorType(ir.IntType(8), 8), 1)
            return builder.sext(v, t.llvm_type()) if signed else builder.zext(v, t.llvm_type())

        return t(a, _offsets_sig(offsets)), codegen
    return typer


widen8 = _named("widen8", """8 bytes at a[offset] (uint8) zero-extended -> s32x8 (vpmovzxbd); widen8(a, o0, o1): 8 at
each, -> s32x16 (two row groups' sub-block scales).""", _widen8(False))
widen8s = _named("widen8s", """As widen8, the bytes sign-extended (int8 bit patterns in a uint8 array: vpmovsxbd; Q6_K's
scales).""", _widen8(True))


def _bcast4(vt):
    def typer(typingctx, a, offset):
        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
            v = _splat(builder, builder.load(builder.bitcast(p, i32.as_pointer()), align=1), ir.VectorType(i32, vt.lanes // 4))
            return builder.bitcast(v, vt.llvm_type())

        return vt(a, types.intp), codegen
    return typer


bcast4 = _named("bcast4", """The 4 bytes at a[offset] (a byte offset) repeated 8 times -> i8x32 (vpbroadcastd).""",
                _bcast4(i8x32))
bcast4w = _named("bcast4w", """The 4 bytes at a[offset] repeated 16 times -> i8x64 (vpbroadcastd zmm).""", _bcast4(i8x64))


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


or_ = _named("or_", """a | b, i8x32 or i8x64 (vpor).""", _binary("i8", "or_"))


def _bytes_op(op, k):
    # the typer of a `op` k (an ir.IRBuilder method, a constant k) per byte of an i8x32 or i8x64
    def typer(typingctx, a):
        t = vec_of("i8", a)
        if t is not None:
            return t(t), lambda context, builder, signature, args: getattr(builder, op)(args[0], _const(t, k))
    return typer


shr4 = _named("shr4", """(a >> 4) & 15 per byte, i8x32 or i8x64 (vpsrlw + vpand).""", _bytes_op("lshr", 4))
low4 = _named("low4", """a & 15 per byte, i8x32 or i8x64.""", _bytes_op("and_", 15))
flip8 = _named("flip8", """a + 128 per signed byte (a ^ 0x80), i8x32 or i8x64: a signed weight as vpdpbusd's unsigned
operand.""", _bytes_op("xor", 128))


def _bits_at(mask, up):
    # ((a >> i) & mask) << up per byte of an i8x32 or i8x64, i a runtime shift (vpsrlw + vpand [+ vpsllw])
    def typer(typingctx, a, i):
        t = vec_of("i8", a)
        if t is None:
            return None

        def codegen(context, builder, signature, args):
            sh = builder.trunc(args[1], ir.IntType(8))
            v = builder.and_(builder.lshr(args[0], _splat(builder, sh, t.llvm_type())), _const(t, mask))
            return builder.shl(v, _const(t, up)) if up else v

        return t(t, types.intp), codegen
    return typer


bit_to_16 = _named("bit_to_16", """((a >> i) & 1) << 4 per byte, i8x32 or i8x64: the fifth bit of a Q5_K weight from its
qh byte.""", _bits_at(1, 4))
bits2 = _named("bits2", """(a >> i) & 3 per byte, i8x32 or i8x64: the two-bit value of a Q3_K/Q2_K weight at bit i of its
plane byte.""", _bits_at(3, 0))
bits2_to_48 = _named("bits2_to_48", """((a >> i) & 3) << 4 per byte, i8x32 or i8x64: the two high bits of a Q6_K weight at
bit i of its high-bits byte, in place above its low nibble.""", _bits_at(3, 4))
bit_to_4 = _named("bit_to_4", """((a >> i) & 1) << 2 per byte, i8x32 or i8x64: the third bit of a Q3_K weight (hmask's)
from its plane byte.""", _bits_at(1, 2))

_NIBBLES = ir.Constant(i32x16.llvm_type(), [0x000F000F] * 16)  # the low nibble of both 16-bit halves of a lane


@intrinsic
def low4_16(typingctx, a):
    """a & 15 per 16-bit lane: s16x16, or s32x16 holding 16-bit pairs (a & 0x000F000F): Q2_K's scale from its
    scale | min << 4 byte."""
    if a == i16x16:
        return i16x16(i16x16), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V16I16, [15] * 16))
    if a == i32x16:
        return i32x16(i32x16), lambda c, builder, s, args: builder.and_(args[0], _NIBBLES)


@intrinsic
def high4_16(typingctx, a):
    """a >> 4 per 16-bit lane (each below 256): s16x16, or s32x16 holding 16-bit pairs ((a >> 4) & 0x000F000F):
    Q2_K's min from its scale | min << 4 byte."""
    if a == i16x16:
        return i16x16(i16x16), lambda c, builder, s, args: builder.lshr(args[0], ir.Constant(_V16I16, [4] * 16))
    if a == i32x16:
        return i32x16(i32x16), lambda c, builder, s, args: builder.and_(builder.lshr(args[0], _const(i32x16, 4)), _NIBBLES)


@intrinsic
def low4_32(typingctx, a):
    """a & 15 per 32-bit lane (s32x8)."""
    return i32x8(i32x8), lambda c, builder, s, args: builder.and_(args[0], ir.Constant(_V8I32, [15] * 8))


@intrinsic
def high4_32(typingctx, a):
    """a >> 4 per 32-bit lane (s32x8, a below 256)."""
    return i32x8(i32x8), lambda c, builder, s, args: builder.lshr(args[0], ir.Constant(_V8I32, [4] * 8))


def _grid16(bias, grid=IQ4_GRID):
    # (isa, a): an i8x32 on the path isa names; (a): an i8x64 (x86's alone have them, so no path: a helper that
    # builds zmm weights takes no isa, an array, whose reference counting would cost a call)
    def typer(typingctx, first, *rest):
        t = rest[0] if len(rest) == 1 else first
        path = path_of(first) if rest else X86_PATHS[-1]
        if len(rest) > 1 or t != (i8x32 if rest else i8x64) or path not in X86_PATHS + ARM_PATHS:
            return None
        v16 = ir.VectorType(ir.IntType(8), 16)
        table = [(v + bias) & 255 for v in grid]
        shuffle = "llvm.x86.avx2.pshuf.b" if t == i8x32 else "llvm.x86.avx512.pshuf.b.512"

        def codegen(context, builder, signature, args):
            a = builder.extract_value(args[1], 0) if rest else args[0]
            if path in X86_PATHS:
                return _call(builder, shuffle, t.llvm_type(), [ir.Constant(t.llvm_type(), table * (t.lanes // 16)), a])
            grid = ir.Constant(v16, table)
            lanes = ir.IntType(32)
            halves = [_call(builder, "llvm.aarch64.neon.tbl1.v16i8", v16,
                            [grid, builder.shuffle_vector(a, a, ir.Constant(ir.VectorType(lanes, 16), list(range(h, h + 16))))])
                      for h in (0, 16)]
            return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(lanes, 32), list(range(32))))

        return t(first, types.StarArgTuple.from_types(rest)), codegen
    return typer


grid16 = _named("grid16", """grid16(isa, a): IQ4_GRID[a] per byte, i8x32, for indices a in 0..15: one vpshufb on x86
(the grid in both 128-bit lanes), a tbl per 16-byte half on aarch64; grid16(a) on an i8x64, x86's: one
vpshufb zmm, the grid in every lane. Not on the portable path (its kernels index the grid).""", _grid16(0))
grid16u = _named("grid16u", """IQ4_GRID[a] + 128 per byte (unsigned, 1..241), as grid16: the grid as the unsigned operand
of vpdpbusd, whose sums are then 128 times the activations' sum too many.""", _grid16(128))
mxgrid16 = _named("mxgrid16", """MX_GRID[a] per byte, as grid16 (MXFP4's E2M1 values doubled).""", _grid16(0, MX_GRID))
mxgrid16u = _named("mxgrid16u", """MX_GRID[a] + 128 per byte (116..140), as grid16u.""", _grid16(128, MX_GRID))


@intrinsic
def abs8(typingctx, a):
    """|a| per signed byte, i8x32 (vpabsb)."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.abs.v32i8", _V32I8, [args[0], ir.Constant(ir.IntType(1), 0)])

    return i8x32(i8x32), codegen


sign8 = _named("sign8", """a with the sign of b per byte (0 where b is 0), i8x32 (vpsignb).""",
               _instr("llvm.x86.avx2.psign.b", i8x32, i8x32, i8x32))
maddubs = _named("maddubs", """u8x32 * s8x32 -> s16x16, adjacent pairs summed with saturation (vpmaddubsw).""",
                 _instr("llvm.x86.avx2.pmadd.ub.sw", i16x16, i8x32, i8x32))
madd = _named("madd", """s16x16 * s16x16 -> s32x8, adjacent pairs summed (vpmaddwd).""",
              _instr("llvm.x86.avx2.pmadd.wd", i32x8, i16x16, i16x16))


@intrinsic
def ones16(typingctx):
    """s16x16 of ones (the second operand of mul_sum_us8_pairs' vpmaddwd)."""
    return i16x16(), lambda c, builder, s, args: ir.Constant(_V16I16, [1] * 16)


@intrinsic
def dpbusd(typingctx, acc, a, b):
    """acc + u8x32 . s8x32 in groups of 4 bytes -> s32x8, no saturation (vpdpbusd, AVX-512 VNNI/VL or AVX-VNNI);
    on zmm u8x64 . s8x64 -> s32x16 (vpdpbusd zmm)."""
    t, u = vec_of("i32", acc), vec_of("i8", a, b)
    if t is None or u is None or u.lanes != 4 * t.lanes:
        return None
    name = f"llvm.x86.avx512.vpdpbusd.{32 * t.lanes}"

    def codegen(context, builder, signature, args):
        lt = t.llvm_type()
        return _call(builder, name, lt, [args[0], builder.bitcast(args[1], lt), builder.bitcast(args[2], lt)])

    return t(t, u, u), codegen


@intrinsic
def dpwssd(typingctx, acc, a, b):
    """acc + s16x32 . s16x32 in pairs -> s32x16, no saturation (vpdpwssd zmm); a and b hold the 16-bit pairs in
    32-bit lanes (pairs16 with two offsets, splat32w of a packed pair)."""
    if vec_of("i32", acc, a, b) == i32x16:
        return i32x16(i32x16, i32x16, i32x16), lambda c, builder, s, args: _call(
            builder, "llvm.x86.avx512.vpdpwssd.512", i32x16.llvm_type(), list(args))


add16 = _named("add16", """a + b, s16x16 (vpaddw; the callers keep the sums in range).""", _binary("i16", "add"))
add32 = _named("add32", """a + b, s32x8 or s32x16 (vpaddd).""", _binary("i32", "add"))
sub32 = _named("sub32", """a - b, s32x8 or s32x16 (vpsubd).""", _binary("i32", "sub"))
mul32 = _named("mul32", """a * b, s32x8 or s32x16, low 32 bits (vpmulld).""", _binary("i32", "mul"))


@intrinsic
def shl32(typingctx, a, n):
    """a << n, s32x8 or s32x16 (a constant shift count: vpslld)."""
    t = vec_of("i32", a)
    if t is None:
        return None

    def codegen(context, builder, signature, args):
        return builder.shl(args[0], _splat(builder, builder.trunc(args[1], ir.IntType(32)), t.llvm_type()))

    return t(t, types.intp), codegen


def _splat32(vt):
    def typer(typingctx, x):
        def codegen(context, builder, signature, args):
            return _splat(builder, context.cast(builder, args[0], signature.args[0], types.int32), vt.llvm_type())

        return vt(x), codegen
    return typer


def _zeros(vt):
    def typer(typingctx):
        return vt(), lambda c, builder, s, args: ir.Constant(vt.llvm_type(), None)
    return typer


splat32 = _named("splat32", """s32x8 with the integer x in every lane.""", _splat32(i32x8))
splat32w = _named("splat32w", """s32x16 with the integer x in every lane.""", _splat32(i32x16))
zero32 = _named("zero32", """s32x8 of zeros.""", _zeros(i32x8))
zero32w = _named("zero32w", """s32x16 of zeros.""", _zeros(i32x16))


def _widen_shuffled(n, order, signed, groups=(1,)):
    # n bytes at each offset (one, or two where `groups` allows) widened to 16 bits (sign- or zero-extended),
    # then placed in the order `order` (per group): s16x16, or two groups' as s32x16 (16-bit pairs)
    def typer(typingctx, a, *offsets):
        g = len(offsets)
        if g not in groups:
            return None

        def codegen(context, builder, signature, args):
            v = _load_halves(context, builder, signature.args[0], args[0], _offsets(builder, args, g),
                             ir.VectorType(ir.IntType(8), n), 1)
            w = ir.VectorType(ir.IntType(16), n * g)
            v = builder.sext(v, w) if signed else builder.zext(v, w)
            idx = [n * k + i for k in range(g) for i in order]
            v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), len(idx)), idx))
            return v if g == 1 else builder.bitcast(v, i32x16.llvm_type())

        return (i16x16 if g == 1 else i32x16)(a, _offsets_sig(offsets)), codegen
    return typer


_DOUBLED = [i // 2 for i in range(16)]            # byte r into both halves of lane r
_PAIRED = [i // 2 + 8 * (i % 2) for i in range(16)]  # byte r of two groups of 8 into the halves of lane r


scales16 = _named("scales16", """8 bytes at a[offset] (uint8), each zero-extended into both 16-bit halves of its 32-bit
lane -> s16x16 (vpmovzxbw + vpunpcklwd): the second operand of a vpmaddwd that applies row r's sub-block
scale to the row's two 16-bit partial sums in lane r.""", _widen_shuffled(8, _DOUBLED, False))
scales16s = _named("scales16s", """As scales16, the bytes sign-extended (int8 bit patterns: Q6_K's scales).""",
                   _widen_shuffled(8, _DOUBLED, True))
pairs16 = _named("pairs16", """16 bytes at a[offset] (uint8), two sub-blocks of 8: lane r holds byte r of the first in
its low 16 bits and byte r of the second in its high 16 bits, zero-extended -> s16x16 (vpmovzxbw + a word
shuffle). With splat_pair16(x0, x1), one vpmaddwd gives lane r a0_r * x0 + a1_r * x1. pairs16(a, o0, o1):
two row groups' 16 bytes as s32x16 holding the pairs, the weight-side operand of dpwssd.""",
                  _widen_shuffled(16, _PAIRED, False, (1, 2)))
pairs16s = _named("pairs16s", """As pairs16, the bytes sign-extended (int8 bit patterns: Q6_K's and Q3_K's scales).""",
                  _widen_shuffled(16, _PAIRED, True, (1, 2)))


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


load8i = _named("load8i", """a.flat[i : i + 8] -> s32x8, an int32 array.""", _load(i32x8))
load16i = _named("load16i", """a.flat[i : i + 16] -> s32x16, an int32 array.""", _load(i32x16))
store8i = _named("store8i", """a.flat[i : i + 8] = v (s32x8), or a.flat[i : i + 16] = v (s32x16), an int32 array.""",
                 _store("i32"))
