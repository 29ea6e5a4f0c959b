"""What the aarch64 kernels compile to: each path's dot-product loops and their instructions per 32-element
block of one row and one token. Run it on aarch64, or emulated from the repository root:

    tests/aarch64/run.sh python benchmarks/arm_instructions.py [--json FILE]

For each path (neon, dotprod, i8mm) and interleaved family (x8: Q4_0/Q4_1/Q5_0/Q5_1; kx8: Q4_K/Q5_K/Q6_K;
q8x8: Q8_0) it finds the basic blocks that hold the path's dot-product instructions (the kernel unit's
assembly, as tests/aarch64/test_arm_kernels.py reads it) and prints, for the largest of them, the block's
instruction count, its dot-product instructions and their byte multiply-accumulates (sdot 16, smmla 32,
smull/smlal 8), and the instructions per 32 MACs: per 32-element block of one row and one token, the unit
llama.cpp's NEON kernels can be counted in. A family has several such loops (decode, batch, each type).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "aarch64"))

from test_arm_kernels import ARM, blocks, unit_asm  # noqa: E402

# multiply-accumulates of one instruction (bytes x bytes): sdot 16 (4 lanes x 4), smmla 32 (2x2 x 8),
# smull/smlal on 8 bytes 8
MACS = {"sdot": 16, "smmla": 32, "smull": 8, "smull2": 8, "smlal": 8, "smlal2": 8}


OPS = {"neon": ("smull", "smull2", "smlal", "smlal2"), "dotprod": ("sdot",), "i8mm": ("smmla", "sdot")}


def loops(asm: str, path: str):
    for b in blocks(asm):
        ops = [i.split()[0] for i in b]
        dots = [o for o in ops if o in OPS[path]]
        if not dots:
            continue
        macs = sum(MACS[o] for o in dots)
        yield {"instructions": len(b), "dot_instructions": len(dots), "mix": sorted(set(dots)),
               "macs": macs, "per_32_elements": round(len(b) * 32 / macs, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    out = {}
    for path in ARM:
        for family in ("x8", "kx8", "q8x8", "nlx8", "k23x8"):
            found = sorted(loops(unit_asm(path, family), path), key=lambda r: -r["macs"])
            out[f"{path}/{family}"] = found
            for r in found[:4]:
                print(f"{path:8} {family:5} loop of {r['instructions']:4} instructions, {r['dot_instructions']:3} "
                      f"{'/'.join(r['mix']):14} ({r['macs']} byte MACs): {r['per_32_elements']:5} instructions "
                      f"per 32 elements of one row and token")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
