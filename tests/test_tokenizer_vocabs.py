"""Our tokenizers against llama.cpp's own vocabulary test set: the tokenizer-only GGUF files in
llama.cpp's models/ folder (ggml-vocab-*.gguf) with their .inp/.out files of expected tokenizations
(made with the vocabularies' Hugging Face tokenizers, and passed by llama.cpp's test-tokenizer-0).

The files come from the llama-cpp-python 0.3.36 source package, fetched once with pip into the model
cache ($EDGEINFER_HOME/vocab-tests), the way catalog models are. Every file with expected outputs whose
tokenizer model is `gpt2` (byte-level BPE), `llama` (SentencePiece), `bert` (WordPiece) or `gemma4` (BPE over
"▁"-escaped text) is checked token for token, whatever its pre-tokenizer: every vocabulary of the set. (An unknown
tokenizer model is a clear error: tests/test_gemma4_tokenizer.py.)"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from edgeinfer import registry
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.tokenizer import Tokenizer, TokenizerError

pytestmark = pytest.mark.model

SDIST = "llama-cpp-python==0.3.36"
SEP = "\n__ggml_vocab_test__\n"
SUPPORTED = ("gpt2", "llama", "bert", "gemma4")


def vocab_dir() -> Path:
    """The folder of ggml-vocab-* files, fetched and unpacked on first use."""
    dest = registry.home() / "vocab-tests" / SDIST.replace("==", "-")
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--disable-pip-version-check", "--dest", tmp, SDIST], check=True, capture_output=True)
        (archive,) = Path(tmp).glob("*.tar.gz")
        out = Path(tmp) / "vocab"
        out.mkdir()
        with tarfile.open(archive) as tf:
            for m in tf.getmembers():
                name = os.path.basename(m.name)
                if m.isfile() and "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
                    with tf.extractfile(m) as src, open(out / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        os.replace(out, dest)  # whole or not at all
    return dest


def cases():
    d = vocab_dir()
    return sorted(p for p in d.glob("ggml-vocab-*.gguf") if (d / (p.name + ".inp")).exists())


def tokenizer_model(path: Path) -> str:
    return GGUFFile(path).get("tokenizer.ggml.model")


@pytest.fixture(scope="module")
def vocab_files():
    files = cases()
    assert len(files) >= 15, [p.name for p in files]  # the set is there, not an empty folder
    return files


def test_every_supported_vocabulary_matches_llama_cpp(vocab_files):
    checked, pre_tokenizers = [], set()
    for path in vocab_files:
        if tokenizer_model(path) not in SUPPORTED:
            continue
        tok = Tokenizer(GGUFFile(path))
        inputs = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEP)
        outputs = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
        assert len(outputs) >= len(inputs) > 10, path.name
        for text, line in zip(inputs, outputs):
            want = [int(x) for x in line.split()]
            assert tok.encode(text, add_bos=False) == want, (path.name, text)
        checked.append(path.name)
        pre_tokenizers.add(GGUFFile(path).get("tokenizer.ggml.pre"))
    # llama-spm, phi-3, gpt-2, llama-bpe, qwen2, qwen35, starcoder, refact, command-r, falcon, mpt,
    # deepseek-llm, deepseek-coder, bert-bge, gemma-4 at llama-cpp-python 0.3.36: all of them
    assert len(checked) >= 15 and len(checked) == len(vocab_files), checked
    assert {"ggml-vocab-bert-bge.gguf", "ggml-vocab-gemma-4.gguf"} <= set(checked)
    assert {"qwen2", "llama-bpe", "deepseek-llm", "falcon"} <= pre_tokenizers

