"""The matrix kinds: one table of every weight layout the kernels read, and the predicates over it.

A repacked matrix (quant/repack.py's QTensor) carries its kind, a small int: the GGML type it comes
from and the layout its fields (qs, qh, sc, d, m) are in. Kinds 0-9, 18, 20, 21 and 24 are quant/repack.py's
row-major layouts (the portable path's, and the CUDA backend's); kinds 10-17, 19, 22, 23 and 25 their
eight-rows-interleaved twins (kernels/cpu/layout.py, the CPU SIMD paths' layout). IQ4_NL, then Q3_K and
Q2_K, then MXFP4 came later than the rest: ids are appended, never renumbered. Each kind's GGML type is declared by one
weight format module (kernels/formats), whose repack makes its arrays and whose decodes read them. Float32
matrices are no QTensor and have no kind (the CUDA backend marks its uploaded float32 matrices with F32 = -1).

This module lives in kernels/ (not kernels/cpu/) because both backends and quant/ read it, and
importing it must not pin Numba's CPU code generator as importing kernels.cpu does. It imports
nothing of ours. Its ids are frozen into compiled code, so it is part of the CPU kernel cache's source
fingerprint (kernels/cpu/cache.py).

The predicates are plain Python functions and, through an inlined Numba overload, the same expression
inside @njit code: each one is generated from the table as a comparison of `kind` with the ids as
integer constants (`is_x8` tests that the id lies in 10..13; `.expr` shows it), so it compiles to the
code of the range test it names. `predicate(prop, within=FAMILY)` gives a property tested only among
one family's kinds (the cheapest comparison that tells them apart: `has_qh` within "x8" tests for id
12 and up), for the kernels of that family.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba.extending import overload

Q8 = "q8"    # activations in 32-element blocks: int8, a float scale, the scaled block sum
Q8_K = "q8k"  # activations in 256-element super-blocks: int8, a float scale, int sums per 32 and per 16

# kernel families: each quantized family is one compiled unit per ISA path (kernels/cpu/units.py)
HALF = "half"  # F16/BF16: the float matmul (kernels/cpu/quant.matmul_half), no unit
FAMILY_NAMES = ("q8_0", "q45", "k45", "q6_k", "x8", "kx8", "q8x8", "nlx8", "k23", "k23x8", "mx4", "mxx8")


@dataclass(frozen=True)
class Kind:
    id: int
    name: str          # the constant's name in this module
    ggml: T            # the GGML type of the file's tensor
    block: int         # values per block (gguf's GGML_QUANT_SIZES)
    block_bytes: int   # bytes per block in the file (gguf's GGML_QUANT_SIZES)
    act: str | None    # the activation format its matmul reads: Q8, Q8_K, or None (float activations)
    family: str        # the kernel family that runs it (FAMILY_NAMES, or HALF)
    fields: tuple      # which of the QTensor arrays qs, qh, sc, d, m it fills (the others are empty)
    interleaved: bool  # eight rows interleaved (kernels/cpu/layout.py) rather than row-major
    twin: int | None   # the interleaved twin of a row-major kind, the row-major twin of an interleaved one

    @property
    def is_dense(self) -> bool:
        return self.act is None

    @property
    def is_quantized(self) -> bool:
        return self.act is not None

    @property
    def uses_q8k(self) -> bool:
        return self.act == Q8_K

    @property
    def has_qh(self) -> bool:  # the fifth bit of each value (Q5_0, Q5_1, Q5_K)
        return "qh" in self.fields

    @property
    def has_min(self) -> bool:  # a block min (Q4_1, Q5_1) or a super-block min scale (Q4_K, Q5_K)
        return "m" in self.fields

    @property
    def has_scales(self) -> bool:  # sub-block scales (K-quants)
        return "sc" in self.fields

    @property
    def is_interleaved(self) -> bool:
        return self.interleaved


# id, name, GGML type, activation, family, fields; interleaved twins follow (ids 10-17, then 19, 22, 23, 25)
_ROW_MAJOR = (
    (0, "F16", T.F16, None, HALF, ("d",)),    # d holds the values themselves (N, K) as 16-bit patterns
    (1, "BF16", T.BF16, None, HALF, ("d",)),
    (2, "Q8_0", T.Q8_0, Q8, "q8_0", ("qs", "d")),
    (3, "Q4_0", T.Q4_0, Q8, "q45", ("qs", "d")),
    (4, "Q4_1", T.Q4_1, Q8, "q45", ("qs", "d", "m")),
    (5, "Q5_0", T.Q5_0, Q8, "q45", ("qs", "qh", "d")),
    (6, "Q5_1", T.Q5_1, Q8, "q45", ("qs", "qh", "d", "m")),
    (7, "Q4_K", T.Q4_K, Q8_K, "k45", ("qs", "sc", "d", "m")),
    (8, "Q5_K", T.Q5_K, Q8_K, "k45", ("qs", "qh", "sc", "d", "m")),
    (9, "Q6_K", T.Q6_K, Q8_K, "q6_k", ("qs", "sc", "d")),
    (18, "IQ4_NL", T.IQ4_NL, Q8, "q45", ("qs", "d")),  # Q4_0's packing, each nibble an index into the 16-value grid
    (20, "Q3_K", T.Q3_K, Q8_K, "k23", ("qs", "qh", "sc", "d")),  # two low bits, the hmask bit, int8 scale per 16
    (21, "Q2_K", T.Q2_K, Q8_K, "k23", ("qs", "sc", "d", "m")),   # two bits; per 16 a 4-bit scale and 4-bit min
    (24, "MXFP4", T.MXFP4, Q8, "mx4", ("qs", "d")),  # Q4_0's packing into the E2M1 grid, d its E8M0 scale bytes
)
# interleaved twin id, row-major id, family
_INTERLEAVED = ((10, 3, "x8"), (11, 4, "x8"), (12, 5, "x8"), (13, 6, "x8"),
                (14, 7, "kx8"), (15, 8, "kx8"), (16, 9, "kx8"), (17, 2, "q8x8"), (19, 18, "nlx8"),
                (22, 20, "k23x8"), (23, 21, "k23x8"), (25, 24, "mxx8"))


def _build() -> tuple:
    twin_of = {rm: x8 for x8, rm, _ in _INTERLEAVED}
    rows = {}
    for i, name, t, act, fam, fields in _ROW_MAJOR:
        block, size = GGML_QUANT_SIZES[t]
        rows[i] = Kind(i, name, t, block, size, act, fam, fields, False, twin_of.get(i))
    for i, rm, fam in _INTERLEAVED:
        r = rows[rm]
        rows[i] = Kind(i, r.name + "_X8", r.ggml, r.block, r.block_bytes, r.act, fam, r.fields, True, rm)
    assert sorted(rows) == list(range(len(rows)))
    return tuple(rows[i] for i in range(len(rows)))


KINDS: tuple[Kind, ...] = _build()  # indexed by id
COUNT = len(KINDS)
for _k in KINDS:
    globals()[_k.name] = _k.id  # F16, BF16, Q8_0, ..., Q6_K, Q4_0_X8, ..., Q6_K_X8, Q8_0_X8
del _k
F32 = -1  # not a kind: a float32 matrix (the CUDA backend's DeviceWeight marks them so)

OF_GGML = {k.ggml: k.id for k in KINDS if not k.interleaved}  # the row-major kind of each GGML type
QUANTIZED = tuple(k.id for k in KINDS if k.is_quantized)       # the kinds the int8 kernels run
FAMILIES = {f: tuple(k.id for k in KINDS if k.family == f) for f in FAMILY_NAMES}
INTERLEAVED = {k.id: k.twin for k in KINDS if not k.interleaved and k.twin is not None}  # row-major -> twin


def info(kind: int) -> Kind:
    return KINDS[int(kind)]


def family(kind: int) -> str:
    """The kernel family of a kind (FAMILY_NAMES, or HALF for the float kinds)."""
    return KINDS[int(kind)].family


def interleaved(kind: int) -> int:
    """The interleaved twin of a row-major quantized kind (KeyError where it has none)."""
    return INTERLEAVED[int(kind)]


def name(kind: int) -> str:
    return KINDS[int(kind)].name


# -- predicates ---------------------------------------------------------------------------------


def comparison(members: frozenset, domain: frozenset) -> str:
    """The comparison of `kind` with integer constants that is true on `members` and false on the rest of
    `domain` (outside the domain: unspecified), in the fewest tests: one equality or inequality where
    one kind is in or out, else one range per run of consecutive ids, open-ended at the domain's ends."""
    inside, outside = sorted(members & domain), sorted(domain - members)
    if not inside:
        return "False"
    if not outside:
        return "True"
    if len(inside) == 1:
        return f"kind == {inside[0]}"
    if len(outside) == 1:
        return f"kind != {outside[0]}"
    runs = [[inside[0], inside[0]]]
    for k in inside[1:]:
        if k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    lo, hi = min(domain), max(domain)
    terms = []
    for a, b in runs:
        if a == b:
            terms.append(f"kind == {a}")
        elif a == lo:
            terms.append(f"kind <= {b}")
        elif b == hi:
            terms.append(f"kind >= {a}")
        else:
            terms.append(f"{a} <= kind <= {b}")
    return " or ".join(terms)


_predicates: dict = {}


def predicate(prop: str, within: str | None = None):
    """The predicate `kind -> bool` for the Kind property `prop` (an attribute of Kind: "has_qh",
    "uses_q8k", ...; or "family:NAME", "ggml:TYPE"), for the kinds of family `within` (None: every kind). Callable from
    Python and from @njit code alike (inlined there as its comparison, `.expr`)."""
    key = (prop, within)
    fn = _predicates.get(key)
    if fn is not None:
        return fn
    domain = frozenset(k.id for k in KINDS if within is None or k.family == within)
    if not domain:
        raise ValueError(f"no kinds in family {within!r}")
    if prop.startswith("family:"):
        members = frozenset(k.id for k in KINDS if k.family == prop[7:])
    elif prop.startswith("ggml:"):
        members = frozenset(k.id for k in KINDS if k.ggml.name == prop[5:])
    else:
        members = frozenset(k.id for k in KINDS if getattr(k, prop))
    expr = comparison(members, domain)
    where = f"{prop} among the {within} kinds" if within else prop
    fn_name = prop.replace("family:", "is_").replace("ggml:", "is_") + (f"_in_{within}" if within else "")
    scope: dict = {}
    exec(f"def {fn_name}(kind):\n    return {expr}\n", scope)  # noqa: S102 (the expression is made above)
    fn = scope[fn_name]
    fn.__doc__ = f"{where}: `{expr}`"
    fn.__module__ = __name__
    fn.expr, fn.members, fn.domain = expr, members & domain, domain

    @overload(fn, inline="always", target="generic")
    def _ov(kind):
        return fn

    _predicates[key] = fn
    return fn


# Over every kind. The family predicates dispatch a matrix to its kernels; the others say which
# activation, fields and layout a kind has.
is_dense = predicate("is_dense")            # F16/BF16, the float matmul
is_quantized = predicate("is_quantized")    # an int8 kernel family
uses_q8k = predicate("uses_q8k")            # reads the activation as Q8_K (K-quants) rather than Q8
is_interleaved = predicate("is_interleaved")
has_qh = predicate("has_qh")
has_min = predicate("has_min")
has_scales = predicate("has_scales")
is_q8_0 = predicate("family:q8_0")
is_q45 = predicate("family:q45")
is_k45 = predicate("family:k45")
is_q6_k = predicate("family:q6_k")
is_x8 = predicate("family:x8")
is_kx8 = predicate("family:kx8")
is_q8x8 = predicate("family:q8x8")
is_nlx8 = predicate("family:nlx8")
is_k23 = predicate("family:k23")
is_k23x8 = predicate("family:k23x8")
is_mx4 = predicate("family:mx4")
is_mxx8 = predicate("family:mxx8")
