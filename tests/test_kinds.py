"""The matrix-kind table (kernels/kinds.py): one entry per GGML type the loader takes, gguf's block sizes,
interleaved twins that round-trip, fields that match what the repacker fills, and predicates that agree
with the table in Python and in compiled code."""

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit

from edgeinfer.kernels import kinds
from edgeinfer.kernels.cpu import layout, simd, units
from edgeinfer.quant import repack as repack_module
from test_kernels import random_tensor

ALL = range(kinds.COUNT)
PROPS = ("is_dense", "is_quantized", "uses_q8k", "is_interleaved", "has_qh", "has_min", "has_scales")


def test_every_type_the_loader_takes_has_exactly_one_row_major_kind():
    loaded = [t for t in repack_module.SUPPORTED_TYPES if t != T.F32]  # F32 stays a float32 array
    widened = repack_module.WIDENED  # the low-bit types run on a wider type's kind (quant/repack.py)
    for t in loaded:
        if t in widened:
            assert not [k for k in kinds.KINDS if k.ggml == t]  # no kind of their own
            assert kinds.info(widened[t]).is_quantized and not kinds.info(widened[t]).interleaved
            continue
        assert [k.id for k in kinds.KINDS if k.ggml == t and not k.interleaved] == [repack_module.KIND[t]]
    assert set(repack_module.KIND) == set(loaded) == set(kinds.OF_GGML) | set(widened)
    assert [k.id for k in kinds.KINDS] == list(ALL)
    for k in kinds.KINDS:
        assert getattr(kinds, k.name) == k.id  # the named constants
    assert kinds.F32 not in ALL


def test_block_sizes_are_ggufs():
    for k in kinds.KINDS:
        assert (k.block, k.block_bytes) == GGML_QUANT_SIZES[k.ggml]


def test_interleaved_twins_round_trip():
    for k in kinds.KINDS:
        if k.interleaved:
            rm = kinds.KINDS[k.twin]
            assert not rm.interleaved and rm.twin == k.id and kinds.interleaved(rm.id) == k.id
            assert (rm.ggml, rm.act, rm.fields) == (k.ggml, k.act, k.fields) and k.name == rm.name + "_X8"
        elif k.is_quantized:
            assert kinds.KINDS[k.twin].interleaved and kinds.KINDS[k.twin].twin == k.id
        else:
            assert k.twin is None
    assert layout.INTERLEAVED == kinds.INTERLEAVED


@pytest.mark.parametrize("t", [t for t in kinds.OF_GGML], ids=lambda t: t.name)
def test_fields_are_the_arrays_the_repacker_fills(t):
    rng = np.random.default_rng(3)
    n, k = 16, 512
    raw, _ = random_tensor(t, n, k, rng)
    w = repack_module.repack(raw, t, (k, n))
    ws = [w] + ([layout.interleave8(w)] if w.kind in kinds.INTERLEAVED else [])
    for x in ws:
        filled = tuple(f for f in repack_module.ARRAYS if getattr(x, f).shape[1] > 0)
        assert filled == kinds.info(x.kind).fields, (kinds.name(x.kind), filled)
        assert kinds.info(x.kind).ggml == t


def test_families_cover_the_quantized_kinds_once():
    assert simd.ALL_KINDS == kinds.QUANTIZED == tuple(k for k in ALL if kinds.is_quantized(k))
    members = [k for fam in kinds.FAMILY_NAMES for k in kinds.FAMILIES[fam]]
    assert sorted(members) == list(kinds.QUANTIZED)
    assert units.FAMILIES == kinds.FAMILIES and units.ATTENTION == kinds.COUNT
    for k in kinds.QUANTIZED:
        fam = kinds.family(k)
        assert all(kinds.info(j).interleaved == kinds.info(k).interleaved for j in kinds.FAMILIES[fam])
        assert all(kinds.info(j).act == kinds.info(k).act for j in kinds.FAMILIES[fam])
    for k in ALL:
        assert kinds.is_dense(k) == (kinds.family(k) == kinds.HALF)


def _predicates():
    out = [(getattr(kinds, p), p, None) for p in PROPS]
    out += [(getattr(kinds, "is_" + f), "family:" + f, None) for f in kinds.FAMILY_NAMES]
    out += [(kinds.predicate(p, fam), p, fam) for fam in kinds.FAMILY_NAMES for p in ("has_qh", "has_min", "has_scales")]
    return out


def _truth(prop, k):
    info = kinds.info(k)
    return info.family == prop[7:] if prop.startswith("family:") else getattr(info, prop)


def test_each_predicate_agrees_with_the_table_in_python_and_compiled():
    preds = _predicates()
    for fn, prop, fam in preds:
        domain = [k for k in ALL if fam is None or kinds.family(k) == fam]
        assert [fn(k) for k in domain] == [_truth(prop, k) for k in domain], (prop, fam, fn.expr)
        assert [fn(np.int64(k)) for k in domain] == [_truth(prop, k) for k in domain]

    # compiled: the same answers inside @njit code (as the kernels call them, on an int64 kind)
    @njit
    def compiled(k):
        return (kinds.is_dense(k), kinds.is_quantized(k), kinds.uses_q8k(k), kinds.is_interleaved(k),
                kinds.has_qh(k), kinds.has_min(k), kinds.has_scales(k), kinds.is_q8_0(k), kinds.is_q45(k),
                kinds.is_k45(k), kinds.is_q6_k(k), kinds.is_x8(k), kinds.is_kx8(k), kinds.is_q8x8(k),
                kinds.is_nlx8(k), kinds.is_k23(k), kinds.is_k23x8(k), kinds.is_mx4(k), kinds.is_mxx8(k))

    n_global = len(PROPS) + len(kinds.FAMILY_NAMES)
    for k in ALL:
        assert list(compiled(np.int64(k))) == [fn(k) for fn, _, _ in preds[:n_global]]


def test_the_predicates_are_the_range_tests_the_kernels_had():
    # generated from the table, each is the comparison the code made by hand before the table existed,
    # so the compiled kernels are the same code (IQ4_NL's kinds, 18 and 19, then Q3_K's and Q2_K's, 20-23,
    # then MXFP4's, 24 and 25, appended since)
    assert kinds.is_dense.expr == "kind <= 1"
    assert kinds.is_quantized.expr == "kind >= 2"
    assert kinds.uses_q8k.expr == "7 <= kind <= 9 or 14 <= kind <= 16 or 20 <= kind <= 23"
    assert kinds.is_interleaved.expr == "10 <= kind <= 17 or kind == 19 or 22 <= kind <= 23 or kind == 25"
    assert [getattr(kinds, "is_" + f).expr for f in kinds.FAMILY_NAMES] == [
        "kind == 2", "3 <= kind <= 6 or kind == 18", "7 <= kind <= 8", "kind == 9", "10 <= kind <= 13",
        "14 <= kind <= 16", "kind == 17", "kind == 19", "20 <= kind <= 21", "22 <= kind <= 23", "kind == 24",
        "kind == 25"]
    assert kinds.predicate("ggml:Q3_K", "k23").expr == "kind == 20"
    assert kinds.predicate("ggml:Q3_K", "k23x8").expr == "kind == 22"
    assert kinds.predicate("has_qh", "q45").expr == "5 <= kind <= 6"
    assert kinds.predicate("ggml:IQ4_NL", "q45").expr == "kind == 18"
    assert kinds.predicate("has_min", "q45").expr == "kind == 4 or kind == 6"
    assert kinds.predicate("has_qh", "k45").expr == "kind == 8"
    assert kinds.predicate("has_qh", "x8").expr == "kind >= 12"
    assert kinds.predicate("has_min", "x8").expr == "kind == 11 or kind == 13"
    assert kinds.predicate("has_qh", "kx8").expr == "kind == 15"
    assert kinds.predicate("has_min", "kx8").expr == "kind != 16"
    assert kinds.predicate("ggml:Q6_K", "kx8").expr == "kind == 16"
    assert kinds.predicate("ggml:Q6_K").members == {kinds.Q6_K, kinds.Q6_K_X8}
    assert kinds.predicate("has_qh", "x8") is kinds.predicate("has_qh", "x8")  # one function per predicate
    with pytest.raises(ValueError, match="no kinds in family"):
        kinds.predicate("has_qh", "nope")
