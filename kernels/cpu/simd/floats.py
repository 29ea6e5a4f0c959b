"""Float vector operations (attention, activations, the interleaved matmuls' accumulation).

Plain IEEE operations with no fast-math flags: a kernel built from them computes the same bits in
every calling context (one row or a tile of rows, inlined or not). Those the avx512 kernels use take a
ymm (f32x8) or a zmm (f32x16) vector (vec.py)."""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vec import (_V8F32, Vec, _binary, _call, _elem_ptr, _load, _load_halves, _named, _offsets, _splat, _store, f32x8,
                  f32x16, vec_of)

@intrinsic
def f32_bits(typingctx, x):
    """The bit pattern of a float32 as uint32 (a bitcast; no instruction)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


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


def half_in_hardware() -> bool:
    """Whether the code generator's target converts float16 itself (F16C on x86-64, every aarch64 core).
    Without it (the portable x86-64-v2 tier) LLVM would call compiler-rt's __extendhfsf2, which Numba's
    JIT cannot link: the widening is then done in integer lanes (_half_bits_to_f32), exactly."""
    import platform

    import numba

    if platform.machine() not in ("x86_64", "AMD64"):
        return True
    features = numba.config.CPU_FEATURES or ""
    if "+f16c" in features or "-f16c" in features:
        return "+f16c" in features
    name = (numba.config.CPU_NAME or "host").lower()
    if name == "host":
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get("f16c", False))
    return name not in ("generic", "x86-64", "x86-64-v2", "core2", "nehalem", "westmere", "penryn")


def _half_bits_to_f32(builder, h16, n: int):
    # <n x i16> float16 bit patterns -> <n x float>, exactly (F. Giesen's half_to_float: the exponent
    # rebiased; infinities and NaNs given the full exponent; zeros and subnormals renormalised by a subtraction)
    i32, f32 = ir.VectorType(ir.IntType(32), n), ir.VectorType(ir.FloatType(), n)
    c = lambda v: ir.Constant(i32, [v] * n)  # noqa: E731
    h = builder.zext(h16, i32)
    o = builder.shl(builder.and_(h, c(0x7FFF)), c(13))
    exp = builder.and_(o, c(0x0F800000))
    o = builder.add(o, c((127 - 15) << 23))
    inf_nan = builder.add(o, c((128 - 16) << 23))
    small = builder.bitcast(builder.fsub(builder.bitcast(builder.add(o, c(1 << 23)), f32),
                                         builder.bitcast(c(113 << 23), f32)), i32)
    o = builder.select(builder.icmp_unsigned("==", exp, c(0x0F800000)), inf_nan, o)
    o = builder.select(builder.icmp_unsigned("==", exp, c(0)), small, o)
    return builder.bitcast(builder.or_(o, builder.shl(builder.and_(h, c(0x8000)), c(16))), f32)


@intrinsic
def loadf8(typingctx, a, *offsets):
    """a.flat[i : i + 8] -> f32x8: float32 values, or float16 bit patterns (uint16) widened (vcvtph2ps);
    loadf8(a, i0, i1): the 8 at each as one f32x16, i0's the low half."""
    native = half_in_hardware()
    if a.dtype == types.float32:
        elem, align = ir.VectorType(ir.FloatType(), 8), 4
    elif a.dtype == types.uint16:
        elem, align = ir.VectorType(ir.HalfType() if native else ir.IntType(16), 8), 2
    else:
        return None
    n = len(offsets)
    if n not in (1, 2):
        return None
    t = f32x8 if n == 1 else f32x16

    def codegen(context, builder, signature, args):
        v = _load_halves(context, builder, signature.args[0], args[0], _offsets(builder, args, n), elem, align, elem=True)
        if a.dtype == types.float32:
            return v
        return builder.fpext(v, t.llvm_type()) if native else _half_bits_to_f32(builder, v, 8 * n)

    return t(a, types.StarArgTuple.from_types([types.intp] * n)), codegen


@intrinsic
def loade8m0(typingctx, a, *offsets):
    """The eight E8M0 bytes at a.flat[i : i + 4] of a uint16 array -> f32x8 of 2^(e - 128) (gguf's
    e8m0_to_fp32_half: (e - 1) << 23 as float32 bits, 0x00200000 << e for e 0 and 1), exactly; loade8m0(a, i0,
    i1): the eight at each as one f32x16, i0's the low half."""
    n = len(offsets)
    if a.dtype != types.uint16 or n not in (1, 2):
        return None
    t = f32x8 if n == 1 else f32x16
    elem = ir.VectorType(ir.IntType(8), 8)

    def codegen(context, builder, signature, args):
        v = _load_halves(context, builder, signature.args[0], args[0], _offsets(builder, args, n), elem, 1, elem=True)
        lanes = 8 * n
        i32 = ir.VectorType(ir.IntType(32), lanes)
        c = lambda x: ir.Constant(i32, [x] * lanes)  # noqa: E731
        e = builder.zext(v, i32)
        normal = builder.shl(builder.sub(e, c(1)), c(23))
        tiny = builder.shl(c(0x00200000), e)
        bits = builder.select(builder.icmp_unsigned("<", e, c(2)), tiny, normal)
        return builder.bitcast(bits, t.llvm_type())

    return t(a, types.StarArgTuple.from_types([types.intp] * n)), codegen


loadf16 = _named("loadf16", """a.flat[i : i + 16] -> f32x16, a float32 array.""", _load(f32x16))
storef8 = _named("storef8", """a.flat[i : i + 8] = v (f32x8), or a.flat[i : i + 16] = v (f32x16), a float32 array.""",
                 _store("f32"))


def _splatf(vt):
    def typer(typingctx, x):
        def codegen(context, builder, signature, args):
            return _splat(builder, context.cast(builder, args[0], signature.args[0], types.float32), vt.llvm_type())

        return vt(x), codegen
    return typer


splatf = _named("splatf", """f32x8 with x in every lane.""", _splatf(f32x8))
splatf16 = _named("splatf16", """f32x16 with x in every lane.""", _splatf(f32x16))


@intrinsic
def fma8(typingctx, a, b, c):
    """a * b + c, f32x8 or f32x16, one rounding (vfmadd)."""
    t = vec_of("f32", a, b, c)
    if t is not None:
        return t(t, t, t), lambda ctx, builder, s, args: _call(builder, f"llvm.fma.v{t.lanes}f32", t.llvm_type(), list(args))


@intrinsic
def fma1(typingctx, a, b, c):
    """a * b + c for float32 scalars, one rounding (the lane-wise twin of fma8)."""
    sig = types.float32(types.float32, types.float32, types.float32)
    return sig, lambda ctx, builder, s, args: _call(builder, "llvm.fma.f32", ir.FloatType(), list(args))


mul8 = _named("mul8", """a * b, f32x8 or f32x16.""", _binary("f32", "fmul"))
add8 = _named("add8", """a + b, f32x8 or f32x16.""", _binary("f32", "fadd"))
sub8 = _named("sub8", """a - b, f32x8 or f32x16.""", _binary("f32", "fsub"))
div8 = _named("div8", """a / b, f32x8 or f32x16 (correctly rounded).""", _binary("f32", "fdiv"))


@intrinsic
def max8(typingctx, a, b):
    """Lane-wise maximum, f32x8 (-inf loses to any number)."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: _call(builder, "llvm.maxnum.v8f32", _V8F32, list(args))


@intrinsic
def min8(typingctx, a, b):
    """Lane-wise minimum, f32x8."""
    return f32x8(f32x8, f32x8), lambda ctx, builder, s, args: _call(builder, "llvm.minnum.v8f32", _V8F32, list(args))


@intrinsic
def transpose8(typingctx, v0, v1, v2, v3, v4, v5, v6, v7):
    """The 8 x 8 matrix whose rows are v0 .. v7 (f32x8), transposed: a tuple of its eight columns, column i
    (v0[i], v1[i], ..., v7[i]). Three rounds of two-input lane shuffles (pairs of rows interleaved, then pairs of
    pairs, then the two 128-bit halves exchanged), the moves of AVX's 8 x 8 transpose; values are only moved."""
    if any(v != f32x8 for v in (v0, v1, v2, v3, v4, v5, v6, v7)):
        return None
    ret = types.UniTuple(f32x8, 8)

    def codegen(context, builder, signature, args):
        def sh(a, b, lanes):
            return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), lanes))

        lo = [sh(args[2 * i], args[2 * i + 1], [0, 8, 1, 9, 4, 12, 5, 13]) for i in range(4)]  # a0 b0 a1 b1 a4 b4 a5 b5
        hi = [sh(args[2 * i], args[2 * i + 1], [2, 10, 3, 11, 6, 14, 7, 15]) for i in range(4)]  # a2 b2 a3 b3 ...
        quads = {}  # (rows 0-3 or 4-7, column c): that column's and column c + 4's four values of those rows
        for half in range(2):
            for c, (src, first) in enumerate(((lo, True), (lo, False), (hi, True), (hi, False))):
                lanes = [0, 1, 8, 9, 4, 5, 12, 13] if first else [2, 3, 10, 11, 6, 7, 14, 15]
                quads[half, c] = sh(src[2 * half], src[2 * half + 1], lanes)
        cols = [None] * 8
        for c in range(4):
            cols[c] = sh(quads[0, c], quads[1, c], [0, 1, 2, 3, 8, 9, 10, 11])
            cols[c + 4] = sh(quads[0, c], quads[1, c], [4, 5, 6, 7, 12, 13, 14, 15])
        return context.make_tuple(builder, ret, cols)

    return ret(f32x8, f32x8, f32x8, f32x8, f32x8, f32x8, f32x8, f32x8), codegen


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
def cvt8(typingctx, a):
    """s32x8 -> f32x8, or s32x16 -> f32x16 (vcvtdq2ps; exact below 2**24)."""
    t = vec_of("i32", a)
    if t is not None:
        f = Vec("f32", t.lanes)
        return f(t), lambda c, builder, s, args: builder.sitofp(args[0], f.llvm_type())


@intrinsic
def storef8_first(typingctx, a, i, v, n):
    """a.flat[i : i + min(n, 8)] = the first n lanes of v (f32x8; f32x16: min(n, 16), n >= 1), a float32 array:
    one store where n covers the vector, a masked store (vmaskmovps, AVX-512's k-mask) of the lanes below n
    otherwise (the last rows of a matrix whose row count is not a multiple of 8). An intrinsic, not a
    helper function, so the loops that call it pay no reference counting for the array."""
    t = vec_of("f32", v)
    if t is None:
        return None
    k = t.lanes

    def codegen(context, builder, signature, args):
        ptr = _elem_ptr(context, builder, signature.args[0], args[0], args[1], t.llvm_type())
        count = context.cast(builder, args[3], signature.args[3], types.int64)
        with builder.if_else(builder.icmp_signed(">=", count, ir.Constant(ir.IntType(64), k))) as (full, part):
            with full:
                builder.store(args[2], ptr, align=4)
            with part:
                lanes = ir.Constant(ir.VectorType(ir.IntType(64), k), list(range(k)))
                mask = builder.icmp_signed("<", lanes, _splat(builder, count, ir.VectorType(ir.IntType(64), k)))
                _call(builder, f"llvm.masked.store.v{k}f32.p0", ir.VoidType(),
                      [args[2], ptr, ir.Constant(ir.IntType(32), 4), mask])
        return context.get_dummy_value()

    return types.void(a, types.intp, t, n), codegen


# -- activation quantization (int8/quantize.py): whole blocks as LLVM vectors, lowered to each target's own
# registers (ymm, zmm, or NEON's q registers); every operation is exact per element (the maximum, the
# multiplication, rint, the integer sums), so the results are those of the element-by-element loops.

def _vec_load(context, builder, aryty, ary, i, n):
    return builder.load(_elem_ptr(context, builder, aryty, ary, i, ir.VectorType(ir.FloatType(), n)), align=4)


@intrinsic
def absmax32(typingctx, a, i):
    """max |a.flat[i : i + 32]| of a float32 array (0 for all zeros)."""
    if a.layout != "C":
        return None

    def codegen(context, builder, signature, args):
        v = _call(builder, "llvm.fabs.v32f32", ir.VectorType(ir.FloatType(), 32),
                  [_vec_load(context, builder, signature.args[0], args[0], args[1], 32)])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [v.type]),
                                            "llvm.vector.reduce.fmax.v32f32")
        return builder.call(fn, [v], fastmath=("nnan",))  # no NaN in activations: a plain vmaxps tree

    return types.float32(a, types.intp), codegen


def _round_store(n, clamp):
    # q = rint(a.flat[i : i + n] * s) (as int32, at most 127 where clamp) stored as bytes into b.flat[j : j + n];
    # returns sum(q)
    def codegen(context, builder, signature, args):
        f = ir.VectorType(ir.FloatType(), n)
        i32 = ir.VectorType(ir.IntType(32), n)
        x = builder.fmul(_vec_load(context, builder, signature.args[0], args[0], args[1], n), _splat(builder, args[4], f))
        q = builder.fptosi(_call(builder, f"llvm.rint.v{n}f32", f, [x]), i32)
        if clamp:
            q = _call(builder, f"llvm.smin.v{n}i32", i32, [q, ir.Constant(i32, [127] * n)])
        dst = _elem_ptr(context, builder, signature.args[2], args[2], args[3], ir.VectorType(ir.IntType(8), n))
        builder.store(builder.trunc(q, ir.VectorType(ir.IntType(8), n)), dst, align=1)
        return _call(builder, f"llvm.vector.reduce.add.v{n}i32", ir.IntType(32), [q])

    return codegen


@intrinsic
def round_store32(typingctx, a, i, b, j, s):
    """q = rint(a.flat[i : i + 32] * s) as int32, stored as int8 bytes into b.flat[j : j + 32] (uint8); -> sum(q)."""
    if a.layout != "C" or b.layout != "C":
        return None
    return types.int32(a, types.intp, b, types.intp, types.float32), _round_store(32, False)


@intrinsic
def round_store16c(typingctx, a, i, b, j, s):
    """As round_store32 for 16 elements, q clamped to at most 127 (Q8_K)."""
    if a.layout != "C" or b.layout != "C":
        return None
    return types.int32(a, types.intp, b, types.intp, types.float32), _round_store(16, True)
