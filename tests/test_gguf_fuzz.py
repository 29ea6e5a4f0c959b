"""Random mutations and truncations of a valid GGUF raise only GGUFError, quickly and in bounded memory."""

import resource
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.gguf_file import GGUFError, GGUFFile
from tiny_models import write_tiny_llama


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("fuzz") / "seed.gguf"
    write_tiny_llama(p)
    return p.read_bytes()


def _check(tmp_path, data: bytes):
    p = tmp_path / "f.gguf"
    p.write_bytes(data)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        gf = GGUFFile(p)
        for name in gf.tensors:  # every view must be within the file
            gf.tensor(name)
        gf.close()
    except GGUFError:
        pass
    assert time.perf_counter() - t0 < 1.0
    # ru_maxrss is a high-water mark (KiB): it grows if this file made the reader allocate much.
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024 < 100


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_mutations(tmp_path, seed_file, data):
    buf = bytearray(seed_file)
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        # Bias towards the header and metadata, where the counts live.
        pos = data.draw(st.integers(0, min(len(buf) - 1, 4096)))
        buf[pos] = data.draw(st.integers(0, 255))
    _check(tmp_path, bytes(buf))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**9))
def test_random_truncations(tmp_path, seed_file, cut):
    _check(tmp_path, seed_file[: cut % len(seed_file)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 4095), value=st.sampled_from([0xFF] * 8 + [0x7F, 0x80, 0x00]))
def test_counts_set_to_huge_values(tmp_path, seed_file, pos, value):
    buf = bytearray(seed_file)
    p = pos % (len(buf) - 8)
    buf[p:p + 8] = bytes([value]) * 8  # turns whatever 8-byte count is there into something huge
    _check(tmp_path, bytes(buf))
