"""The vector types the operations take and give (LLVM vectors held in registers), and the codegen helpers
they share.

Two widths: ymm (256 bits: i8x32, i16x16, i32x8, f32x8) and zmm (512 bits: i8x64, i32x16, f32x16, the
avx512 path's). An operation on vectors has one name for both (`vec_of` types it on its operands' width
and it emits the LLVM of that width), written with the ymm lane shapes; only the operations that take no
vector (zeros, broadcasts, loads of one array run) name the zmm form apart (zero32w, bcast4w, ...).

A zmm vector of the avx512 kernels holds two interleaved groups of eight rows (16 output rows): the low
32 bytes from group g, the high 32 from group g + 1 (the loads with two offsets, load32(a, o0, o1): two
loads, the second folded into a vinserti64x4), with the same lane shapes as the ymm vectors, so the 16
rows' integer sums, and every float operation on them, are the ymm path's lane for lane: the same bits.
AVX-512 has no vpsignb, so signed weights enter vpdpbusd as w + 128 (unsigned, flip8) and the kernels
subtract 128 times each activation block's sum. Pairs of 16-bit values for vpdpwssd (pairs16 with two
offsets, dpwssd) are held as i32x16, one pair per 32-bit lane."""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

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
i8x64 = Vec("i8", 64)
i32x16 = Vec("i32", 16)
f32x16 = Vec("f32", 16)
_V32I8 = i8x32.llvm_type()
_V16I16 = i16x16.llvm_type()
_V8I32 = i32x8.llvm_type()
_V8F32 = f32x8.llvm_type()
_LANES = ir.IntType(32)


def vec_of(kind: str, *args):
    """The vector type of args where all are the same Vec of `kind` ("i8", "i16", "i32", "f32"), ymm or zmm
    wide: what an operation that takes either width gives; None otherwise (the operation does not type)."""
    t = args[0]
    if isinstance(t, Vec) and t.kind == kind and t.lanes * int(kind[1:]) in (256, 512) and all(a == t for a in args):
        return t
    return None


def _const(vt, x):
    # x in every lane of the Vec type vt
    return ir.Constant(vt.llvm_type(), [x] * vt.lanes)


def _concat(builder, lo, hi):
    n = lo.type.count
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_LANES, 2 * n), list(range(2 * n))))


def _load_halves(context, builder, aryty, ary, offsets, vtype, align, elem=False):
    # one vtype load at each offset (bytes, or elements where elem), concatenated: a ymm vector from one offset,
    # a zmm vector of two groups from two
    ptr = _elem_ptr if elem else _bytes_ptr
    halves = [builder.load(ptr(context, builder, aryty, ary, o, vtype), align=align) for o in offsets]
    return halves[0] if len(halves) == 1 else _concat(builder, *halves)


def _offsets(builder, args, n):
    # the star-argument tuple of an operation's n offsets (args[1]) as values
    return [builder.extract_value(args[1], i) for i in range(n)]


def _binary(kind: str, op: str):
    # the typer of a lane-wise `a op b` (an ir.IRBuilder method) on two vectors of `kind`, either width
    def typer(typingctx, a, b):
        t = vec_of(kind, a, b)
        if t is not None:
            return t(t, t), lambda context, builder, signature, args: getattr(builder, op)(args[0], args[1])
    return typer


def _instr(name: str, ret, a, b):
    # the typer of one LLVM intrinsic (an instruction) of two operands of fixed vector types
    def typer(typingctx, x, y):
        return ret(a, b), lambda context, builder, signature, args: _call(builder, name, ret.llvm_type(), list(args))
    return typer


def _load(vt):
    # the typer of a.flat[i : i + lanes] -> vt, an array of vt's element type
    def typer(typingctx, a, i):
        def codegen(context, builder, signature, args):
            return builder.load(_elem_ptr(context, builder, signature.args[0], args[0], args[1], vt.llvm_type()), align=4)

        return vt(a, types.intp), codegen
    return typer


def _store(kind: str):
    # the typer of a.flat[i : i + lanes] = v, v a vector of `kind` (either width), an array of its element type
    def typer(typingctx, a, i, v):
        t = vec_of(kind, v)
        if t is None:
            return None

        def codegen(context, builder, signature, args):
            builder.store(args[2], _elem_ptr(context, builder, signature.args[0], args[0], args[1], t.llvm_type()), align=4)
            return context.get_dummy_value()

        return types.void(a, types.intp, t), codegen
    return typer


def _named(name: str, doc: str, typer):
    # an intrinsic made by a factory, with its own name and docstring
    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


# The instructions past AVX2 that the vnni and avx512 paths use, and the features (llvmlite's names) that
# provide each, any one set. Where the code generator's target (the ISA tier, cache.codegen_features) has
# none of them, _call writes the same integers in AVX2's instructions instead (_EMULATED): the kernels of
# those paths then compile and run on any AVX2 machine, slowly and with the same bits, which is how the
# tests check their arithmetic where the CPU lacks the instructions (paths.EMULATE_ENV).
_NEEDS = {
    "llvm.x86.avx512.vpdpbusd.256": (frozenset({"avx512vnni", "avx512vl"}), frozenset({"avxvnni"})),
    "llvm.x86.avx512.vpdpbusd.512": (frozenset({"avx512vnni", "avx512f"}),),
    "llvm.x86.avx512.vpdpwssd.512": (frozenset({"avx512vnni", "avx512f"}),),
    "llvm.x86.avx512.pshuf.b.512": (frozenset({"avx512bw"}),),
}


def _call(builder, name, ret, args):
    needs = _NEEDS.get(name)
    if needs is not None:
        from ..cache import codegen_features

        have = codegen_features()
        if not any(n <= have for n in needs):
            return _EMULATED[name](builder, *args)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _dot_groups(builder, acc, a, b, signed_a, width, group):
    # acc + the sum of each `group` adjacent products a_i b_i, with a and b read as vectors of `width`-bit
    # integers (a signed or unsigned, b signed) and the products in 32 bits: vpdpbusd (8, 4, a unsigned)
    # and vpdpwssd (16, 2, signed), which neither saturate (sums modulo 2**32, in any order the same)
    n = acc.type.count
    narrow = ir.VectorType(ir.IntType(width), n * group)
    wide = ir.VectorType(ir.IntType(32), n * group)
    ext = builder.sext if signed_a else builder.zext
    p = builder.mul(ext(builder.bitcast(a, narrow), wide), builder.sext(builder.bitcast(b, narrow), wide))
    for k in range(group):
        lanes = ir.Constant(ir.VectorType(ir.IntType(32), n), [group * i + k for i in range(n)])
        acc = builder.add(acc, builder.shuffle_vector(p, p, lanes))
    return acc


def _pshufb512(builder, table, idx):
    # vpshufb on zmm (a byte shuffle within each 128-bit lane) as two ymm ones: AVX2's is also per lane
    i32 = ir.IntType(32)
    halves = []
    for h in (0, 32):
        pick = ir.Constant(ir.VectorType(i32, 32), list(range(h, h + 32)))
        halves.append(_call(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [builder.shuffle_vector(table, table, pick),
                                                                       builder.shuffle_vector(idx, idx, pick)]))
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(i32, 64), list(range(64))))


_EMULATED = {
    "llvm.x86.avx512.vpdpbusd.256": lambda builder, acc, a, b: _dot_groups(builder, acc, a, b, False, 8, 4),
    "llvm.x86.avx512.vpdpbusd.512": lambda builder, acc, a, b: _dot_groups(builder, acc, a, b, False, 8, 4),
    "llvm.x86.avx512.vpdpwssd.512": lambda builder, acc, a, b: _dot_groups(builder, acc, a, b, True, 16, 2),
    "llvm.x86.avx512.pshuf.b.512": _pshufb512,
}


def _splat(builder, value, vtype):
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), vtype.count), None))


def _byte_ptr(context, builder, aryty, ary, offset):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [offset])


def _elem_ptr(context, builder, aryty, ary, index, vtype):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), vtype.as_pointer())


def _bytes_ptr(context, builder, aryty, ary, offset, vtype):
    return builder.bitcast(_byte_ptr(context, builder, aryty, ary, offset), vtype.as_pointer())
