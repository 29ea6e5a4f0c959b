#!/usr/bin/env bash
# Run edgeinfer on aarch64 under emulation: tests/aarch64/run.sh [COMMAND...]
#
# Makes (or reuses) an aarch64 root and runs COMMAND with `python`, `python3` and `edgeinfer` on PATH
# running the aarch64 Python in it under qemu-user (`qemu-aarch64-static -cpu max`: every Armv8/v9
# feature, dotprod and i8mm included), in the caller's working directory and environment
# (EDGEINFER_HOME and the rest pass through). With no COMMAND it runs the suite's aarch64 part,
# tests/aarch64/. On an aarch64 machine it runs the suite or COMMAND natively. Examples:
#   tests/aarch64/run.sh edgeinfer system
#   tests/aarch64/run.sh python script.py
#   EDGEINFER_QEMU_CPU=cortex-a72 tests/aarch64/run.sh edgeinfer system   # a core without dotprod
#
# What it builds, under $EDGEINFER_AARCH64_DIR (default ~/.cache/edgeinfer-aarch64), each step once and
# again only when its inputs change:
#   root/   Debian bookworm's arm64 packages (python3 and what it needs, libgomp for Numba's threads),
#           fetched by `debootstrap --foreign` from the host's own Debian mirror and unpacked (nothing in it
#           is executed: the files are all that is needed; no chroot, no binfmt_misc);
#   site/   the project's dependencies and pytest as PyPI's aarch64 wheels (the host's pip with
#           --platform; numba and llvmlite publish manylinux aarch64 wheels);
#   proj/   this checkout installed editable (so the emulated Python runs the files you edit);
#   bin/    the wrappers: `python` is qemu running root/usr/bin/python3.11 (its argv[0] set to the wrapper,
#           so sys.executable starts a new emulated process, as multiprocessing's spawn does).
# qemu's -L makes the emulated program see root/ first for every path that exists there (/usr/lib,
# /etc/ld.so.cache, ...) and the host's files for the rest (the checkout, EDGEINFER_HOME, /tmp).
# Compiled kernels go where they go natively ($EDGEINFER_HOME/kernels), in folders of aarch64 tiers.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${EDGEINFER_AARCH64_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer-aarch64}
ROOT=$DIR/root
SUITE="python -m pytest -q -p no:cacheprovider tests/aarch64"
PY=${PYTHON:-python3}

say() { echo "aarch64: $*" >&2; }
die() { echo "aarch64: $*" >&2; exit 1; }

need_tools() {
    local missing=()
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "needs ${missing[*]} (Debian packages): sudo apt-get install ${missing[*]}"
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

mirror() {
    # the host's Debian archive, as apt is set up here (deb822 sources or the one-line format)
    [ -n "${EDGEINFER_DEBIAN_MIRROR:-}" ] && { echo "$EDGEINFER_DEBIAN_MIRROR"; return; }
    local m
    m=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | grep -oE '(https?://[^ ]+/debian)/?( |$)' | grep -v security | head -n 1 | tr -d ' ')
    [ -n "$m" ] || die "no Debian mirror in /etc/apt/sources*: set EDGEINFER_DEBIAN_MIRROR"
    echo "${m%/}"
}

make_root() {
    [ -f "$ROOT/.edgeinfer-root" ] && return
    need_tools
    say "building the arm64 root (Debian bookworm, once)"
    rm -rf "$ROOT.tmp"
    debootstrap --foreign --arch=arm64 --variant=minbase --include=python3,libgomp1,libstdc++6 \
        bookworm "$ROOT.tmp" "$(mirror)" >"$DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed: see $DIR/debootstrap.log"
    # the second stage would run the packages' scripts inside the root (needs chroot and binfmt_misc):
    # unpacking them is all the emulated Python needs
    for deb in "$ROOT.tmp"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT.tmp"; done
    rm -f "$ROOT.tmp"/var/cache/apt/archives/*.deb
    # the host's own places show through where the root has nothing: temporary files, home, /proc
    rm -rf "${ROOT:?}.tmp"/{tmp,home,root,dev,proc,sys,run,mnt,media,srv}
    # bytecode is the same on every machine: compile the standard library here, not under emulation
    "$PY" -m compileall -q -j 0 "$ROOT.tmp/usr/lib/python3.11" >/dev/null 2>&1 || true
    touch "$ROOT.tmp/.edgeinfer-root"
    rm -rf "$ROOT" && mv "$ROOT.tmp" "$ROOT"
}

requirements() {
    # the runtime's dependencies (pyproject.toml) and the test runner
    "$PY" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(deps + ["pytest>=7"]))
EOF
}

make_site() {
    local reqs stamp platforms=()
    reqs=$(requirements)
    stamp=$(echo "$reqs" | sha256sum | cut -c1-16)
    [ -f "$DIR/site/.stamp-$stamp" ] && return
    say "installing the aarch64 wheels"
    for v in 17 24 26 27 28 31 34 35 36; do platforms+=(--platform "manylinux_2_${v}_aarch64"); done
    rm -rf "$DIR/site.tmp"
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --disable-pip-version-check --target "$DIR/site.tmp" "${platforms[@]}" \
        --platform manylinux2014_aarch64 --implementation cp --python-version 3.11 --only-binary=:all: \
        $(echo "$reqs" | tr '\n' ' ') >"$DIR/pip.log" 2>&1 || die "pip failed: see $DIR/pip.log"
    touch "$DIR/site.tmp/.stamp-$stamp"
    rm -rf "$DIR/site" && mv "$DIR/site.tmp" "$DIR/site"
}

make_proj() {
    # this checkout, editable (pure Python: the host's pip builds it)
    local stamp
    stamp=$(cat "$REPO/pyproject.toml" <(echo "$REPO") | sha256sum | cut -c1-16)
    [ -f "$DIR/proj/.stamp-$stamp" ] && return
    rm -rf "$DIR/proj"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR/proj" -e "$REPO" \
        >"$DIR/pip-proj.log" 2>&1 || die "installing the checkout failed: see $DIR/pip-proj.log"
    touch "$DIR/proj/.stamp-$stamp"
}

make_bin() {
    mkdir -p "$DIR/bin" "$DIR/boot"
    cat >"$DIR/boot/sitecustomize.py" <<EOF
import site
site.addsitedir("$DIR/site")
site.addsitedir("$DIR/proj")
EOF
    cat >"$DIR/bin/python3" <<EOF
#!/bin/sh
# the aarch64 Python of $ROOT, under qemu-user (tests/aarch64/run.sh)
PYTHONPATH="$DIR/boot\${PYTHONPATH:+:\$PYTHONPATH}" PYTHONNOUSERSITE=1 exec qemu-aarch64-static -L "$ROOT" -cpu "\${EDGEINFER_QEMU_CPU:-max}" \\
    -0 "$DIR/bin/python3" "$ROOT/usr/bin/python3.11" "\$@"
EOF
    cat >"$DIR/bin/edgeinfer" <<EOF
#!/bin/sh
exec "$DIR/bin/python3" -c 'import sys; from edgeinfer.cli.main import main; sys.argv[0] = "edgeinfer"; sys.exit(main())' "\$@"
EOF
    chmod +x "$DIR/bin/python3" "$DIR/bin/edgeinfer"
    ln -sf python3 "$DIR/bin/python"
    ln -sf python3 "$DIR/bin/python3.11"
}

if [ "$(uname -m)" = aarch64 ]; then  # a real ARM machine: the same suite or command, natively
    if [ $# -eq 0 ]; then cd "$REPO" && exec python3 -m pytest -q -p no:cacheprovider tests/aarch64; fi
    exec "$@"
fi
mkdir -p "$DIR"
need_tools
make_root
make_site
make_proj
make_bin
export PATH="$DIR/bin:$PATH" EDGEINFER_AARCH64_EMULATED=1
unset PYTHONHOME VIRTUAL_ENV
if [ $# -eq 0 ]; then
    cd "$REPO"
    # shellcheck disable=SC2086
    exec $SUITE
fi
exec "$@"
