"""How compiled code calls a kernel unit by address (units.py makes the units): the int64 table's slots,
each unit's one signature, and the call intrinsics.

`call_rows` / `call_attention` are an indirect call in Numba's own calling convention, a few nanoseconds,
made once per task of rows (never per element). Each intrinsic accepts exactly the argument types of its
unit's signature, declared here: a mismatch fails the caller's compile, never a call with the wrong
arguments. A leaf: the callers (int8.matmuls, the MoE kernels, the compiled step) and units.py, which
compiles int8's rows kernels into units, all import it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.np.numpy_support import from_dtype
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..kinds import COUNT
from ..kv_format import KV_FORMATS, KV_TYPES_ALL, kv_pair
from . import simd

# -- the call -------------------------------------------------------------------------------------


def call_codegen(argtys):
    # the call of the function at address args[0] with args[1:], in Numba's calling convention; an error
    # it reports is raised in the caller
    def codegen(context, builder, signature, args):
        ptr_ty = context.call_conv.get_function_type(types.void, argtys).as_pointer()
        fn = builder.inttoptr(args[0], ptr_ty)
        status, _ = context.call_conv.call_function(builder, fn, types.void, argtys, args[1:])
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return codegen


def check(what: str, argtys: tuple, fits: bool) -> None:
    if not fits:
        raise TypingError(f"a call of the {what} unit with {argtys}, not its signature")


@intrinsic
def call_rows(typingctx, addr, w, q8, q8k, luts, out, n0, n1):
    """The rows unit at addr (Table slot of w's kind): rows [n0, n1) of W @ x -> out, as int8.rows_any."""
    argtys = (w, q8, q8k, luts, out, n0, n1)
    check("matmul rows", argtys, argtys == ROWS_SIG)
    return types.void(addr, *argtys), call_codegen(argtys)


@intrinsic
def call_attention(typingctx, addr, q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale,
                   window, softcap, sinks, out, threads):
    """The attention unit at addr (Table slot ATTENTION): attention.paged_attention's arguments."""
    argtys = (q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, sinks, out,
              threads)
    check("attention", argtys, any(argtys == attention_sig(kv) for kv in KV_DTYPES))
    return types.void(addr, *argtys), call_codegen(argtys)


# -- signatures -----------------------------------------------------------------------------------

_U8 = types.Array(types.uint8, 2, "C")
_U16 = types.Array(types.uint16, 2, "C")
_F32 = types.Array(types.float32, 2, "C")
_I32 = types.Array(types.int32, 2, "C")
MAT = types.Tuple((types.int64, _U8, _U8, _U8, _U16, _U16))  # int8.as_tuple: (kind, qs, qh, sc, d, m)
Q8 = types.Tuple((_U8, _F32, _F32))
Q8K = types.Tuple((_U8, _F32, _I32, _I32))
LUTS = types.Array(types.float32, 2, "C")  # quant.HALF_TO_F32
ROWS_SIG = (MAT, Q8, Q8K, LUTS, _F32, types.int64, types.int64)  # (w, q8, q8k, luts, out (T, N), n0, n1)

# table slots: one per matrix kind (the float kinds' unused), then paged attention, then one per matrix kind
# again for the matmuls of at most simd.SMALL_TOKENS_OF[kind] tokens (SMALL + kind: the small-path units, or the
# same as the first where the small path is the path), then a mixture-of-experts layer's FFN (filled for
# models with experts alone: step.call_experts) and a hybrid model's recurrent mixer (step.call_mixer)
ATTENTION = COUNT
SMALL = ATTENTION + 1
EXPERTS = SMALL + COUNT
MIXER = EXPERTS + 1
LORA = MIXER + 1  # lora.apply: LoRA adapters' low-rank products (a model with adapters)
TABLE_SIZE = LORA + 1


@njit(inline="always", cache=True)
def slot(kind, tokens):
    """The table slot of a matmul of `tokens` tokens of a matrix of this kind."""
    return kind + SMALL if tokens <= simd.SMALL_TOKENS_OF[kind] else kind


# every KV type (one for both, or K/V: kv_format.KV_TYPES_ALL) -> the element types of its K and V arrays
KV_DTYPES = {name: tuple(KV_FORMATS[t].storage for t in kv_pair(name)) for name in KV_TYPES_ALL}


def kv_type_of(k_dtype, v_dtype) -> str:
    """The KV type whose K and V arrays have these element types."""
    return next(kv for kv, (k, v) in KV_DTYPES.items() if np.dtype(k) == np.dtype(k_dtype)
                and np.dtype(v) == np.dtype(v_dtype))


def attention_sig(kv: str) -> tuple:
    """attention.paged_attention's argument types for a KV cache of type kv (KV_DTYPES' names)."""
    k, v = (types.Array(from_dtype(np.dtype(d)), 3, "C") for d in KV_DTYPES[kv])
    f3 = types.Array(types.float32, 3, "C")
    i1 = types.Array(types.int64, 1, "C")
    return (f3, k, v, i1, i1, types.Array(types.int32, 2, "C"), types.int64, types.float32, types.int64,
            types.float32, types.Array(types.float32, 1, "C"), f3, types.int64)
