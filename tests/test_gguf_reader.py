"""The strict GGUF reader: every malformed input raises GGUFError naming the problem."""

import struct

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT

from edgeinfer.gguf_file import GGUFError, GGUFFile
from gguf_bytes import build, kv, s, tensor_info, valid

ARCH = kv("general.architecture", VT.STRING, "llama")
F32, Q4_0, Q8_0 = 0, 2, 8


def _open(tmp_path, data: bytes):
    p = tmp_path / "m.gguf"
    p.write_bytes(data)
    return GGUFFile(p)


def test_valid_file_reads_metadata_and_zero_copy_tensor(tmp_path):
    gf = _open(tmp_path, valid(64))
    assert gf.architecture == "llama"
    w = gf.tensor("w")
    assert w.shape == (64,) and w.dtype == np.float32
    np.testing.assert_array_equal(w, np.arange(64, dtype=np.float32))
    assert not w.flags.owndata  # a view over the memory map


def test_reads_gguf_writer_output(tmp_path):
    import gguf

    p = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ü"])
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    gf = GGUFFile(p)
    assert gf.metadata["llama.block_count"] == 2
    assert gf.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ü"]
    assert gf.tensors["t"].shape == (4, 3)
    np.testing.assert_array_equal(gf.tensor("t"), np.arange(12, dtype=np.float32).reshape(3, 4))


MALFORMED = {
    "empty": (b"", "empty file"),
    "bad_magic": (b"GGML" + valid()[4:], "bad magic"),
    "short_magic": (b"GG", "truncated"),
    "version_1": (build(version=1), "unsupported GGUF version 1"),
    "version_99": (build(version=99), "unsupported GGUF version 99"),
    "big_endian": (b"GGUF" + struct.pack(">I", 3) + b"\0" * 16, "big-endian"),
    "truncated_header": (valid()[:12], "truncated"),
    "truncated_kv": (build(kvs=[ARCH])[:60], "truncated"),
    "truncated_counts": (valid()[:40], "larger than the 16 bytes left"),
    "truncated_tensor_info": (build(kvs=[ARCH], tensors=[tensor_info("w", [64], F32, 0)])[:80], "truncated"),
    "huge_kv_count": (build(n_kv=2**62), "metadata key count"),
    "huge_tensor_count": (build(n_tensors=2**63), "tensor count"),
    "huge_array": (build(kvs=[s("a") + struct.pack("<IIQ", VT.ARRAY, VT.UINT32, 2**63)]), "declares"),
    "huge_string_array": (build(kvs=[s("a") + struct.pack("<IIQ", VT.ARRAY, VT.STRING, 2**40)]), "declares"),
    "huge_string": (build(kvs=[s("a") + struct.pack("<IQ", VT.STRING, 2**60)]), "declares length"),
    "huge_key": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**50) + b"ab" * 8, "declares length"),
    "unknown_value_type": (build(kvs=[s("a") + struct.pack("<I", 99) + b"\0" * 8]), "unknown value type 99"),
    "unknown_array_elem_type": (build(kvs=[s("a") + struct.pack("<IIQ", VT.ARRAY, 77, 1)]), "unknown value type 77"),
    "duplicate_key": (build(kvs=[ARCH, ARCH]), "duplicate metadata key"),
    "empty_key": (build(kvs=[kv("", VT.UINT32, 1)]), "empty metadata key"),
    "bad_utf8_key": (build(kvs=[s(b"\xff\xfe") + struct.pack("<II", VT.UINT32, 1)]), "UTF-8"),
    "bad_bool": (build(kvs=[kv("x", VT.UINT8, 7)[:-1] + b"", ]) if False else
                 build(kvs=[s("flag") + struct.pack("<IB", VT.BOOL, 5)]), "bool"),
    "unknown_ggml_type": (build(kvs=[ARCH], tensors=[tensor_info("w", [32], 255, 0)], data=b"\0" * 128),
                          "unknown ggml type 255"),
    "duplicate_tensor": (build(kvs=[ARCH], tensors=[tensor_info("w", [8], F32, 0), tensor_info("w", [8], F32, 32)],
                               data=b"\0" * 64), "duplicate tensor name"),
    "empty_tensor_name": (build(kvs=[ARCH], tensors=[tensor_info("", [8], F32, 0)], data=b"\0" * 32), "empty name"),
    "five_dims": (build(kvs=[ARCH], tensors=[tensor_info("w", [1, 1, 1, 1, 1], F32, 0)], data=b"\0" * 32),
                  "5 dimensions"),
    "zero_dims": (build(kvs=[ARCH], tensors=[tensor_info("w", [], F32, 0)], data=b"\0" * 32), "0 dimensions"),
    "zero_dimension": (build(kvs=[ARCH], tensors=[tensor_info("w", [4, 0], F32, 0)], data=b"\0" * 32),
                       "zero dimension"),
    "overflowing_dimension": (build(kvs=[ARCH], tensors=[tensor_info("w", [2**63], F32, 0)], data=b"\0" * 32),
                              "overflows"),
    "element_count_overflow": (build(kvs=[ARCH], tensors=[tensor_info("w", [2**31, 2**31, 2**31], F32, 0)],
                                     data=b"\0" * 32), "element count overflows"),
    "row_not_block_multiple": (build(kvs=[ARCH], tensors=[tensor_info("w", [33], Q8_0, 0)], data=b"\0" * 64),
                               "not a multiple of the Q8_0 block size 32"),
    "alignment_wrong_type": (build(kvs=[ARCH, kv("general.alignment", VT.UINT64, 32)]),
                             "'general.alignment' at offset"),
    "alignment_not_power_of_two": (build(kvs=[ARCH, kv("general.alignment", VT.UINT32, 24)], alignment=24),
                                   "not a power of two"),
    "alignment_zero": (build(kvs=[ARCH, kv("general.alignment", VT.UINT32, 0)]), "not a power of two"),
    "misaligned_offset": (build(kvs=[ARCH], tensors=[tensor_info("w", [8], F32, 4)], data=b"\0" * 64),
                          "not aligned"),
    "overlapping_tensors": (build(kvs=[ARCH], tensors=[tensor_info("a", [64], F32, 0), tensor_info("b", [8], F32, 32)],
                                  data=b"\0" * 256), "overlaps"),
    "tensor_past_end": (build(kvs=[ARCH], tensors=[tensor_info("w", [1024], F32, 0)], data=b"\0" * 64),
                        "runs past the end"),
    "arch_not_string": (build(kvs=[kv("general.architecture", VT.UINT32, 1)]), "'general.architecture'"),
    "scores_not_f32": (build(kvs=[ARCH, kv("tokenizer.ggml.scores", VT.ARRAY, (VT.INT32, [1, 2]))]),
                       "'tokenizer.ggml.scores'"),
    "tokens_not_strings": (build(kvs=[ARCH, kv("tokenizer.ggml.tokens", VT.ARRAY, (VT.UINT8, [1, 2]))]),
                           "'tokenizer.ggml.tokens'"),
    "arch_key_wrong_type": (build(kvs=[ARCH, kv("llama.block_count", VT.STRING, "thirty")]),
                            "'llama.block_count'"),
    "rope_base_not_float": (build(kvs=[ARCH, kv("llama.rope.freq_base", VT.STRING, "1e4")]),
                            "'llama.rope.freq_base'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_raises_gguf_error(tmp_path, case):
    data, fragment = MALFORMED[case]
    with pytest.raises(GGUFError) as ei:
        _open(tmp_path, data)
    assert fragment in str(ei.value), str(ei.value)


def test_errors_name_the_offset(tmp_path):
    with pytest.raises(GGUFError, match=r"offset \d+"):
        _open(tmp_path, build(kvs=[ARCH, ARCH]))


def test_gguf_error_is_a_value_error():
    assert issubclass(GGUFError, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
