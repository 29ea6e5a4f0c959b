"""The vector types the operations take and give (LLVM vectors held in registers), and the codegen helpers
they share."""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import models, register_model

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
