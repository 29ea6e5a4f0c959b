"""Reference blocks from llama.cpp's own quantizers for tests/test_lowbit.py: tests/golden/lowbit_blocks.npz.
usage: python benchmarks/make_lowbit_golden.py [OUT.npz]      (default tests/golden/lowbit_blocks.npz)

The input is tests/test_lowbit.py's: a fixed-seed (48, 1024) float32 matrix with heavy columns, an all-zero row,
a constant row, a row that is zero but for one block, sparse, heavy-tailed and -0.0 rows, a fixed-seed importance
row and a sparse one. Each type is
quantized by ggml_quantize_chunk (libggml-base from llama-cpp-python, through ctypes: what
llama_model_quantize calls for every tensor) without an importance matrix (the reference quantizers) and with
it (the `_impl` ones). Needs llama-cpp-python; not a test dependency."""
import ctypes
import glob
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_lowbit import IMATRIX_TYPES, K_TYPES, PLAIN_TYPES, sample, sparse_importance  # noqa: E402

import llama_cpp  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "lowbit_blocks.npz")
lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so*"))[0])
lib.ggml_quantize_chunk.restype = ctypes.c_size_t
lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_int64, ctypes.c_void_p]
lib.ggml_quantize_init.argtypes = [ctypes.c_int]


def ggml_quantize(x, t, imatrix=None):
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    block, size = GGML_QUANT_SIZES[t]
    out = np.zeros((rows, k // block * size), np.uint8)
    lib.ggml_quantize_init(int(t))
    im = None if imatrix is None else np.ascontiguousarray(imatrix, np.float32)
    lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, rows, k, None if im is None else im.ctypes.data)
    return out


x, imp = sample()
arrays = {}
for name in PLAIN_TYPES + K_TYPES:
    arrays[f"{name}_plain"] = ggml_quantize(x, T[name])
for name in IMATRIX_TYPES:
    arrays[f"{name}_imatrix"] = ggml_quantize(x, T[name], imp)
    arrays[f"{name}_sparse_imatrix"] = ggml_quantize(x, T[name], sparse_importance())
np.savez_compressed(OUT, **arrays)
print(f"{OUT}: {', '.join(arrays)} (llama-cpp-python {llama_cpp.__version__})")
