"""The repacked weights' layout file: written at the first load, mapped at the next with the same arrays
and logits, and never trusted when damaged, truncated, of another version or of another model file."""

import os
import struct

import numpy as np
import pytest

from edgeinfer import LLM, SamplingParams
from edgeinfer.kernels.cpu.backend import KERNEL_PATH
from edgeinfer.kernels.cpu.layout import layout_id
from edgeinfer.kernels.cpu.simd import PATHS
from edgeinfer.models import layout_cache


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def tokens(path):
    llm = LLM(str(path), progress=False)
    out = llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
    return llm, out


def layout_files(home):
    d = home / "layouts"
    return sorted(d.iterdir()) if d.is_dir() else []


def test_first_load_writes_the_layout_and_the_next_maps_it(home, tiny_llama_path):
    llm1, first = tokens(tiny_llama_path)
    files = layout_files(home)
    assert len(files) == 1 and files[0].name.startswith("tiny-llama-")
    llm2, second = tokens(tiny_llama_path)
    assert second == first
    a, b = llm1.model.layers[0].wq, llm2.model.layers[0].wq
    for f in ("qs", "qh", "sc", "d", "m"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    # the second model's weights are views of the mapped file, not fresh memory
    assert not b.qs.flags.owndata and b.qs.base is not None


def corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "flip":  # one bit inside the biggest array
        import json

        hlen = struct.unpack_from("<Q", data, len(layout_cache.MAGIC) + 4)[0]
        header = json.loads(bytes(data[len(layout_cache.MAGIC) + 12:len(layout_cache.MAGIC) + 12 + hlen]))
        arrays = [a for t in header["tensors"].values() for a in t["arrays"]]
        big = max(arrays, key=lambda a: np.prod(a[2]) * np.dtype(a[1]).itemsize)
        data[layout_cache._data_start(hlen) + big[3] + 5] ^= 0x10
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "version":
        struct.pack_into("<I", data, len(layout_cache.MAGIC), layout_cache.VERSION + 1)
    elif how == "garbage":
        data = bytearray(b"not a layout at all")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,reason", [("flip", "CRC"), ("truncate", ""), ("version", "version"), ("garbage", "")])
def test_a_damaged_or_stale_layout_is_rebuilt_never_trusted(home, tiny_llama_path, how, reason):
    _, first = tokens(tiny_llama_path)
    (f,) = layout_files(home)
    corrupt(f, how)
    store = layout_cache.LayoutStore(str(tiny_llama_path), KERNEL_PATH)
    assert not store.valid and store.stale_reason is not None and reason in store.stale_reason
    assert not f.exists()  # removed, not left for the next load to trip over
    _, again = tokens(tiny_llama_path)  # rebuilt from the GGUF: the same tokens, and a good file again
    assert again == first
    (g,) = layout_files(home)
    assert layout_cache.LayoutStore(str(tiny_llama_path), KERNEL_PATH).valid


def test_another_model_file_gets_its_own_layout_and_the_old_one_goes(home, tiny_llama_path, tmp_path):
    copy = tmp_path / "tiny-llama.gguf"
    copy.write_bytes(tiny_llama_path.read_bytes())
    tokens(copy)
    (old,) = layout_files(home)
    os.utime(copy, ns=(1, 1))  # the model file changed (as far as anyone can tell without reading it all)
    tokens(copy)
    (new,) = layout_files(home)
    assert new != old and not old.exists()


def test_layouts_can_be_turned_off(home, tiny_llama_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_LAYOUT_CACHE", "0")
    tokens(tiny_llama_path)
    assert layout_files(home) == []


def test_paths_that_read_the_same_bytes_share_one_layout_file(home, tiny_llama_path):
    """Named by the layout, not the kernel path: vnni, avx512 and avx2 (and the aarch64 paths) read the same
    interleaved bytes, so they resolve to one file, and a file one of them wrote serves the others."""
    model = str(tiny_llama_path)
    where = {p: layout_cache.LayoutStore(model, p).path for p in PATHS}
    assert where["vnni"] == where["avx512"] == where["avx2"] == where["neon"] == where["dotprod"] == where["i8mm"]
    assert where["portable"] != where["avx2"]
    assert {layout_id(p) for p in PATHS} == {"rows", "x8"} and "-x8-" in where["avx512"]
    tokens(tiny_llama_path)
    (f,) = layout_files(home)
    assert str(f) == where[KERNEL_PATH]
    for p in PATHS:
        if layout_id(p) == layout_id(KERNEL_PATH):
            assert layout_cache.LayoutStore(model, p).valid, p
    assert layout_files(home) == [f]


def test_a_layout_file_named_after_a_kernel_path_is_removed_when_found(home, tiny_llama_path):
    """Files of VERSION 3 and before were named after the kernel path (one per path, the same bytes): the
    first store of the model removes them, of any identity, and leaves other models' files alone."""
    d = home / "layouts"
    d.mkdir(parents=True)
    ident = layout_cache.model_identity(str(tiny_llama_path))[:16]
    old = [d / f"tiny-llama-vnni-{ident}.layout", d / f"tiny-llama-avx512-{ident}.layout",
           d / "tiny-llama-avx2-0123456789abcdef.layout"]
    others = [d / f"tiny-llama-2-vnni-{ident}.layout", d / f"other-avx512-{ident}.layout"]
    for p in old + others:
        p.write_bytes(b"an old layout")
    store = layout_cache.LayoutStore(str(tiny_llama_path), "avx512")
    assert not any(p.exists() for p in old) and all(p.exists() for p in others)
    assert not store.valid and store.stale_reason is None  # the new name was never written: no file yet
