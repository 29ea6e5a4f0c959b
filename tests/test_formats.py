"""The weight formats registry (kernels/formats): one module per family of GGML types declares each type once,
and the repack, the decodes, the interleaving and the loaded size are driven from it, never from a chain
over types. A new type is one module there and one row in TYPES below."""

import ast
import os

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from edgeinfer.kernels import formats, get_backend, kinds
from edgeinfer.kernels.cpu import quant as cpu_quant
from edgeinfer.kernels.cpu.layout import INTERLEAVED, interleave8
from edgeinfer.quant import repack as repack_module

kb = get_backend("cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# type: (the module declaring it, bytes per block once repacked)
TYPES = {
    T.F16: ("half", 2), T.BF16: ("half", 2),
    T.Q8_0: ("q8_0", 34),
    T.Q4_0: ("legacy", 18), T.Q4_1: ("legacy", 20), T.Q5_0: ("legacy", 22), T.Q5_1: ("legacy", 24),
    T.IQ4_NL: ("iq4", 18), T.IQ4_XS: ("iq4", 144),  # IQ4_XS as IQ4_NL: a float16 scale per 32
    T.Q4_K: ("k45", 148), T.Q5_K: ("k45", 180),     # the 12 bytes of 6-bit scales decoded to 16
    T.Q6_K: ("q6_k", 274),                          # its values a byte each
    T.Q3_K: ("k23", 114), T.Q2_K: ("k23", 84),
    T.MXFP4: ("mxfp4", 17),                         # as in the file: 16 bytes of nibbles, the E8M0 scale byte
}


def module_name(mod) -> str:
    return mod.__name__.rsplit(".", 1)[1]


def test_every_kind_has_exactly_one_format_module():
    declared = [t.ggml for mod in formats.MODULES for t in mod.TYPES]
    assert len(declared) == len(set(declared))
    for k in kinds.KINDS:
        owners = [module_name(mod) for mod in formats.MODULES if k.ggml in {t.ggml for t in mod.TYPES}]
        assert owners == [TYPES[k.ggml][0]], k.name
    assert set(formats.TYPES) == set(TYPES)  # every type the loader reads has its row here


def test_every_module_of_the_package_is_a_registered_format():
    here = os.path.dirname(formats.__file__)
    files = {n[:-3] for n in os.listdir(here) if n.endswith(".py") and n not in ("__init__.py", "base.py")}
    assert {module_name(mod) for mod in formats.MODULES} == files
    for mod in formats.MODULES:
        assert mod.TYPES and callable(mod.group) and callable(mod.element) and isinstance(mod.BITS, dict)
        assert (mod.regroup is None) == (not any(k in INTERLEAVED for k in formats.kinds_of(mod)))


@pytest.mark.parametrize("t", list(TYPES), ids=lambda t: t.name)
def test_a_type_declares_its_block_once(t):
    """The block's fields tile its bytes exactly (gguf's size); the loaded size is what the repack makes."""
    f = formats.of(t)
    assert (f.block, f.block_bytes) == GGML_QUANT_SIZES[t]
    spans = sorted(f.fields.values())
    assert spans[0][0] == 0 and spans[-1][1] == f.block_bytes
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert f.loaded_bytes(f.block * 64, f.block_bytes * 64) == TYPES[t][1] * 64
    assert repack_module.loaded_bytes(t, f.block * 64, f.block_bytes * 64) == TYPES[t][1] * 64


def random_blocks(t, n, k, rng):
    """Random file bytes (n, row bytes) of type t with its float16 fields small normal values."""
    f = formats.of(t)
    if f.block == 1:
        v = rng.standard_normal((n, k)).astype(np.float32)
        return (v.astype(np.float16).view(np.uint8) if t == T.F16
                else (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)).reshape(n, -1)
    raw = rng.integers(0, 256, (n, k // f.block, f.block_bytes), dtype=np.uint8)
    if "e" in f.fields:  # an E8M0 scale: 2^(e - 128), from subnormal float32s (e 0, 1) to 12 x 2^122 (finite)
        raw[:, :, f.fields["e"][0]] = rng.integers(0, 251, (n, k // f.block), dtype=np.uint8)
    for name in ("d", "m"):
        if name in f.fields:
            a = f.fields[name][0]
            raw[:, :, a:a + 2] = (rng.standard_normal((n, k // f.block, 1)) * 0.05).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("t", list(TYPES), ids=lambda t: t.name)
def test_a_type_repacks_and_decodes_as_gguf_dequantizes(t):
    """Row-major and interleaved, the registry's repack and decode give gguf's values (bit for bit; the
    widened types within their float16 scale rounding), the embedding lookup the same rows, and the arrays
    take the loaded size."""
    rng = np.random.default_rng(int(t))
    f = formats.of(t)
    n, k = 13, max(f.block, 32) * 4
    raw = random_blocks(t, n, k, rng)
    ref = gguf.quants.dequantize(raw, t).reshape(n, k).astype(np.float32)
    w = repack_module.repack(raw, t, (k, n))
    assert w.kind == f.kind and w.nbytes == repack_module.loaded_bytes(t, n * k, raw.nbytes)
    ws = [w] + ([interleave8(repack_module.repack(raw, t, (k, n)))] if w.kind in INTERLEAVED else [])
    for x in ws:
        got = kb.dequantize(x)
        ids = np.array([12, 0, 5, 5, n - 1])
        # the embedding lookup (a unit compiled for this kind alone) decodes each row to the whole matrix's
        # values (a zero's sign aside: both compile with fast-math, free to choose it)
        np.testing.assert_array_equal(kb.embed(x, ids), got[ids])
        if t in repack_module.WIDENED:
            np.testing.assert_allclose(got, ref, rtol=2**-10, atol=0)
        else:
            np.testing.assert_array_equal(got, ref)
        # a range of rows is a matrix of its own over the same arrays (a draft's head: speculative.draft_head)
        for r0, r1 in ((0, 8), (8, n)):
            np.testing.assert_array_equal(kb.dequantize(x.rows(r0, r1)), got[r0:r1])
        with pytest.raises(ValueError, match="group of 8" if kinds.info(x.kind).interleaved else "within"):
            x.rows(4, 8) if kinds.info(x.kind).interleaved else x.rows(8, n + 1)


def test_the_decodes_are_generated_from_the_registry():
    """One branch per format module in the CPU and CUDA decodes, each a comparison of the kind with constants."""
    from edgeinfer.kernels.cuda import quant as cuda_quant

    for fn, n_modules in ((cpu_quant.decode_group.py_func, len(formats.MODULES)),
                          (cuda_quant._dq.py_func if hasattr(cuda_quant._dq, "py_func") else cuda_quant._dq.fn,
                           len(formats.MODULES))):
        src = fn.source
        assert sum(line.strip().startswith(("if ", "elif ", "else:")) for line in src.splitlines()) == n_modules, src
        for k in kinds.KINDS:
            assert k.name not in src


# the files driven from the registry: no type is named in their code (docstrings and comments may)
REGISTRY_DRIVEN = ("quant/repack.py", "kernels/cpu/quant.py", "kernels/cuda/quant.py", "kernels/cpu/layout.py")
TYPE_NAMES = {k.name for k in kinds.KINDS} | {t.name for t in TYPES}


def names_in_code(path: str) -> set[str]:
    """The type names a file's code uses: as names, attributes (kinds.Q4_K, T.Q4_K) or string constants."""
    with open(path) as fh:
        tree = ast.parse(fh.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value)
    return found & TYPE_NAMES


@pytest.mark.parametrize("rel", REGISTRY_DRIVEN)
def test_no_chain_over_types_remains_in_repack_decode_or_layout(rel):
    assert names_in_code(os.path.join(ROOT, rel)) == set()


def test_each_type_is_named_in_one_format_module():
    here = os.path.dirname(formats.__file__)
    named = {module_name(mod): names_in_code(os.path.join(here, module_name(mod) + ".py")) for mod in formats.MODULES}
    for t, (owner, _) in TYPES.items():
        assert [m for m, names in named.items() if t.name in names] == [owner], t.name
