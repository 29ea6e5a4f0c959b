"""Named vector operations for the int8 dot-product kernels, and the choice of instruction-set path.

Each operation is a Numba intrinsic that emits one LLVM vector instruction (or a short fixed
sequence), named as ggml names its x86 idioms. LLVM never emits ``vpmaddubsw`` by itself, so the
integer dot products are written in these names (see int8.py).

The path is chosen once, at import, from the host CPU's features (llvmlite.binding), or forced with
EDGEINFER_KERNELS=portable|avx2|vnni:

- ``vnni``: AVX-512 VNNI (with VL) or AVX-VNNI: u8 x s8 dot products in one ``vpdpbusd``;
- ``avx2``: ``vpmaddubsw`` then ``vpmaddwd`` with ones (u8 x s8 -> s16 pairs -> s32);
- ``portable``: plain Numba integer loops that LLVM vectorizes for whatever CPU this is.

Kernels take the path as an argument, ``isa``: a 0-length array whose dtype names the path (int8:
portable, int16: avx2, int32: vnni). Its type, not its value, selects the code at compile time, so
each path is a separate specialization in Numba's on-disk cache (forcing another path never loads
the wrong one) and calling costs no more than passing an array.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

PATHS = ("portable", "avx2", "vnni")
ALL_KINDS = tuple(range(2, 18))  # the quantized matrix kinds (quant/repack.py 2-9, layout.py 10-17)


def host_features() -> set[str]:
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
    except RuntimeError:
        pass
    feats = llvm.get_host_cpu_features()
    return {name for name, on in feats.items() if on}


def available_paths() -> list[str]:
    """The paths this CPU can execute, slowest first."""
    f = host_features()
    paths = ["portable"]
    if "avx2" in f and "fma" in f and "f16c" in f:
        paths.append("avx2")
        if "avxvnni" in f or ("avx512vnni" in f and "avx512vl" in f):
            paths.append("vnni")
    return paths


def choose_path() -> str:
    forced = os.environ.get("EDGEINFER_KERNELS", "").strip().lower()
    have = available_paths()
    if forced:
        if forced not in PATHS:
            raise ValueError(f"EDGEINFER_KERNELS must be one of {', '.join(PATHS)}, got {forced!r}")
        if forced not in have:
            raise ValueError(f"EDGEINFER_KERNELS={forced}: this CPU cannot run that path (it can run {', '.join(have)})")
        return forced
    return have[-1]


def isa_tag(path: str, kinds=None) -> np.ndarray:
    """The `isa` argument that selects `path` in the kernels, and the matrix kinds they must handle (None:
    every kind). Both live in the argument's type (an empty array of a record dtype whose field names
    say them), so a compiled function holds the code of that path and those kinds alone: a model's
    forward pass compiles the matmul kernels of its own weight types, not of all sixteen."""
    kinds = ALL_KINDS if kinds is None else tuple(sorted({int(k) for k in kinds}))
    if path not in PATHS or not kinds or not set(kinds) <= set(ALL_KINDS):
        raise ValueError(f"bad kernel tag: path {path!r}, kinds {kinds}")
    return np.empty(0, np.dtype([(path, np.uint8)] + [(f"k{k}", np.uint8) for k in kinds]))


def path_of(isa) -> str:
    """Inside an @overload: the path an `isa` argument's type names."""
    return next(iter(isa.dtype.fields))


def kinds_of(isa) -> frozenset:
    """Inside an @overload: the matrix kinds an `isa` argument's type names."""
    return frozenset(int(name[1:]) for name in isa.dtype.fields if name.startswith("k"))


# -- vector types -------------------------------------------------------------------------------


class Vec(types.Type):
    """An LLVM vector value held in a register: `lanes` lanes of `kind` ("i8", "i16", "i32", "f32")."""

    def __init__(self, kind: str, lanes: int):
        self.kind = kind
        self.lanes = lanes
        super().__init__(name=f"{kind}x{lanes}")

    def llvm_type(self):
        elem = ir.FloatType() if self.kind == "f32" else ir.IntType(int(self.kind[1:]))
        return ir.VectorType(elem, self.lanes)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.llvm_type())


i8x32 = Vec("i8", 32)
i16x16 = Vec("i16", 16)
i32x8 = Vec("i32", 8)
f32x8 = Vec("f32", 8)
_V32I8 = i8x32.llvm_type()
_V16I16 = i16x16.llvm_type()
_V8I32 = i32x8.llvm_type()
_V8F32 = f32x8.llvm_type()


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _splat(builder, value, vtype):
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), vtype.count), None))


def _byte_ptr(context, builder, aryty, ary, offset):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [offset])


# -- loads --------------------------------------------------------------------------------------


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
def widen8(typingctx, a, offset):
    """8 bytes at a[offset] (uint8) zero-extended -> s32x8 (vpmovzxbd)."""
    sig = i32x8(a, types.intp)

    def codegen(context, builder, signature, args):
        v8 = ir.VectorType(ir.IntType(8), 8)
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        return builder.zext(builder.load(builder.bitcast(p, v8.as_pointer()), align=1), _V8I32)

    return sig, codegen




@intrinsic
def bits_to_bytes(typingctx, bits, value):
    """bytes_from_bits_32: bit j of a uint32 -> byte j of i8x32, `value` where set, 0 where clear."""
    sig = i8x32(types.uint32, types.uint8)

    def codegen(context, builder, signature, args):
        mask = builder.bitcast(args[0], ir.VectorType(ir.IntType(1), 32))
        return builder.select(mask, _splat(builder, args[1], _V32I8), ir.Constant(_V32I8, None))

    return sig, codegen


# -- byte arithmetic ----------------------------------------------------------------------------


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


@intrinsic
def bit_to_16(typingctx, a, i):
    """((a >> i) & 1) << 4 per byte, i8x32: the fifth bit of a Q5_K weight from its qh byte."""
    def codegen(context, builder, signature, args):
        sh = builder.trunc(args[1], ir.IntType(8))
        v = builder.lshr(args[0], _splat(builder, sh, _V32I8))
        return builder.shl(builder.and_(v, ir.Constant(_V32I8, [1] * 32)), ir.Constant(_V32I8, [4] * 32))

    return i8x32(i8x32, types.intp), codegen


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


# -- integer dot products -----------------------------------------------------------------------


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
def add32(typingctx, a, b):
    """a + b, s32x8 (vpaddd)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def mul32(typingctx, a, b):
    """a * b, s32x8, low 32 bits (vpmulld)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.mul(args[0], args[1])


@intrinsic
def zero32(typingctx):
    """s32x8 of zeros."""
    return i32x8(), lambda c, builder, s, args: ir.Constant(_V8I32, None)




@intrinsic
def f32_bits(typingctx, x):
    """The bit pattern of a float32 as uint32 (a bitcast; no instruction)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


# -- float accumulation -------------------------------------------------------------------------


@intrinsic
def zerof(typingctx):
    """f32x8 of zeros."""
    return f32x8(), lambda c, builder, s, args: ir.Constant(_V8F32, None)



@intrinsic
def hsum_f(typingctx, a):
    """hsum_float_8: the 8 lanes of an f32x8 summed in a fixed tree order -> float32."""
    def codegen(context, builder, signature, args):
        v4 = ir.VectorType(ir.FloatType(), 4)
        idx = lambda xs: ir.Constant(ir.VectorType(ir.IntType(32), len(xs)), xs)  # noqa: E731
        lo = builder.shuffle_vector(args[0], args[0], idx([0, 1, 2, 3]))
        hi = builder.shuffle_vector(args[0], args[0], idx([4, 5, 6, 7]))
        s = builder.fadd(lo, hi)
        s2 = builder.fadd(builder.shuffle_vector(s, s, idx([0, 1])), builder.shuffle_vector(s, s, idx([2, 3])))
        return builder.fadd(builder.extract_element(s2, ir.Constant(ir.IntType(32), 0)),
                            builder.extract_element(s2, ir.Constant(ir.IntType(32), 1)))

    return types.float32(f32x8), codegen


# -- float vectors (attention, activations, the interleaved matmuls) ---------------------------------
#
# Plain IEEE operations with no fast-math flags: a kernel built from them computes the same bits in
# every calling context (one row or a tile of rows, inlined or not).


def _elem_ptr(context, builder, aryty, ary, index, vtype):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), vtype.as_pointer())


@intrinsic
def loadf8(typingctx, a, i):
    """a.flat[i : i + 8] -> f32x8: float32 values, or float16 bit patterns (uint16) widened (vcvtph2ps)."""
    if a.dtype == types.float32:
        def codegen(context, builder, signature, args):
            return builder.load(_elem_ptr(context, builder, signature.args[0], args[0], args[1], _V8F32), align=4)
    elif a.dtype == types.uint16:
        def codegen(context, builder, signature, args):
            h8 = ir.VectorType(ir.HalfType(), 8)
            return builder.fpext(builder.load(_elem_ptr(context, builder, signature.args[0], args[0], args[1], h8),
                                              align=2), _V8F32)
    else:
        return None
    return f32x8(a, types.intp), codegen


@intrinsic
def storef8(typingctx, a, i, v):
    """a.flat[i : i + 8] = v, a float32 array."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], _elem_ptr(context, builder, signature.args[0], args[0], args[1], _V8F32), align=4)
        return context.get_dummy_value()

    return types.void(a, types.intp, f32x8), codegen


@intrinsic
def splatf(typingctx, x):
    """f32x8 with x in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.float32), _V8F32)

    return f32x8(x), codegen


@intrinsic
def fma8(typingctx, a, b, c):
    """a * b + c, f32x8, one rounding (vfmadd)."""
    return f32x8(f32x8, f32x8, f32x8), lambda ctx, builder, s, args: _call(builder, "llvm.fma.v8f32", _V8F32, list(args))


@intrinsic
def mul8(typingctx, a, b):
    """a * b, f32x8."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: builder.fmul(args[0], args[1])


@intrinsic
def add8(typingctx, a, b):
    """a + b, f32x8."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: builder.fadd(args[0], args[1])


@intrinsic
def sub8(typingctx, a, b):
    """a - b, f32x8."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: builder.fsub(args[0], args[1])


@intrinsic
def max8(typingctx, a, b):
    """Lane-wise maximum, f32x8 (-inf loses to any number)."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: _call(builder, "llvm.maxnum.v8f32", _V8F32, list(args))


@intrinsic
def hmax8(typingctx, a):
    """The largest lane of an f32x8 -> float32."""
    def codegen(context, builder, signature, args):
        return _call(builder, "llvm.vector.reduce.fmax.v8f32", ir.FloatType(), [args[0]])

    return types.float32(f32x8), codegen


@intrinsic
def lane8(typingctx, a, i):
    """Lane i of an f32x8 -> float32."""
    def codegen(context, builder, signature, args):
        return builder.extract_element(args[0], builder.trunc(args[1], ir.IntType(32)))

    return types.float32(f32x8, types.intp), codegen


@intrinsic
def keep8(typingctx, v, first, lo, hi, fill):
    """v where lane index first + i lies in [lo, hi), `fill` elsewhere (the keys a query may see)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        idx = builder.add(_splat(builder, args[1], ir.VectorType(i64, 8)), ir.Constant(ir.VectorType(i64, 8), list(range(8))))
        inside = builder.and_(builder.icmp_signed(">=", idx, _splat(builder, args[2], ir.VectorType(i64, 8))),
                              builder.icmp_signed("<", idx, _splat(builder, args[3], ir.VectorType(i64, 8))))
        return builder.select(inside, args[0], _splat(builder, args[4], _V8F32))

    return f32x8(f32x8, types.intp, types.intp, types.intp, types.float32), codegen


@intrinsic
def exp8(typingctx, v):
    """e**v per lane, f32x8, within 2 ulp (Cephes' expf: 2**n times a degree-7 polynomial); 0 below -87."""
    def codegen(context, builder, signature, args):
        c = lambda x: ir.Constant(_V8F32, [x] * 8)  # noqa: E731
        fma = lambda a, b, d: _call(builder, "llvm.fma.v8f32", _V8F32, [a, b, d])  # noqa: E731
        v = args[0]
        x = _call(builder, "llvm.minnum.v8f32", _V8F32, [_call(builder, "llvm.maxnum.v8f32", _V8F32, [v, c(-88.0)]),
                                                          c(88.0)])
        fx = _call(builder, "llvm.floor.v8f32", _V8F32, [fma(x, c(1.44269504088896341), c(0.5))])
        r = fma(fx, c(-0.693359375), x)
        r = fma(fx, c(2.12194440e-4), r)
        p = c(1.9875691500e-4)
        for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = fma(p, r, c(k))
        y = fma(builder.fmul(p, r), r, builder.fadd(r, c(1.0)))
        i32v = ir.VectorType(ir.IntType(32), 8)
        n = builder.fptosi(fx, i32v)
        pow2 = builder.bitcast(builder.shl(builder.add(n, ir.Constant(i32v, [127] * 8)), ir.Constant(i32v, [23] * 8)),
                               _V8F32)
        out = builder.fmul(y, pow2)
        return builder.select(builder.fcmp_ordered("<", v, c(-87.0)), c(0.0), out)

    return f32x8(f32x8), codegen


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
def add16(typingctx, a, b):
    """a + b, s16x16 (vpaddw; the callers keep the sums in range)."""
    return i16x16(i16x16, i16x16), lambda c, builder, s, args: builder.add(args[0], args[1])


@intrinsic
def cvt8(typingctx, a):
    """s32x8 -> f32x8 (vcvtdq2ps; exact below 2**24)."""
    return f32x8(i32x8), lambda c, builder, s, args: builder.sitofp(args[0], _V8F32)


@intrinsic
def fma1(typingctx, a, b, c):
    """a * b + c for float32 scalars, one rounding (the lane-wise twin of fma8)."""
    sig = types.float32(types.float32, types.float32, types.float32)
    return sig, lambda ctx, builder, s, args: _call(builder, "llvm.fma.f32", ir.FloatType(), list(args))


@intrinsic
def div8(typingctx, a, b):
    """a / b, f32x8 (correctly rounded)."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: builder.fdiv(args[0], args[1])


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
def splat32(typingctx, x):
    """s32x8 with the integer x in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.int32), _V8I32)

    return i32x8(x), codegen


@intrinsic
def sub32(typingctx, a, b):
    """a - b, s32x8 (vpsubd)."""
    return i32x8(i32x8, i32x8), lambda c, builder, s, args: builder.sub(args[0], args[1])


@intrinsic
def store32(typingctx, a, offset, v):
    """a[offset : offset + 32] = v (i8x32), a uint8 array, offset in bytes."""
    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, _V32I8.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(a, types.intp, i8x32), codegen
