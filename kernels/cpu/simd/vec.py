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


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _splat(builder, value, vtype):
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), vtype.count), None))


def _byte_ptr(context, builder, aryty, ary, offset):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [offset])


def _elem_ptr(context, builder, aryty, ary, index, vtype):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), vtype.as_pointer())
