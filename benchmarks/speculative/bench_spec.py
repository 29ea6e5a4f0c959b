"""Speculative decoding: decode speed with and without, side by side with llama.cpp's, on prompt files.

Two workloads ship beside this script:
- code_completion.json: code prefixes to continue (raw prompts), for a draft model;
- edit_code.json: "repeat this code with an edit" chat requests, for prompt lookup.

For edgeinfer, every prompt is decoded greedily (--max-tokens) with speculation off and on, interleaved,
--repeats times (`edgeinfer.bench.spec_compare`): decode tokens per second (the first token, which the
prompt's prefill produces, is not counted) and the acceptance rate; the outputs must be identical.

For llama.cpp (--llama-bin DIR: a llama.cpp build with llama-speculative-simple, llama-lookup and
llama-bench), in the same run, with the same threads: its plain decode speed (llama-bench tg), and its
speculative decode over the same prompts, rendered to the same text (llama-speculative-simple with the
draft, or llama-lookup), greedy, the same --max-tokens; medians over --repeats.

    python benchmarks/speculative/bench_spec.py qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
        --prompts benchmarks/speculative/code_completion.json --llama-bin ~/llama.cpp/build/bin
    python benchmarks/speculative/bench_spec.py smollm2-135m-instruct --lookup \
        --prompts benchmarks/speculative/edit_code.json --llama-bin ~/llama.cpp/build/bin

The figures are printed, and saved as JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from results_io import save  # noqa: E402

from edgeinfer import LLM, registry  # noqa: E402
from edgeinfer.bench import _prompt_ids, load_spec_prompts, spec_compare  # noqa: E402
from edgeinfer.system import system_info  # noqa: E402


def llama_plain_tg(bin_dir: str, model: str, threads: int, n: int, repeats: int) -> float:
    """llama.cpp's plain decode speed: llama-bench's tg (tokens per second, its mean of `repeats` runs)."""
    out = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-p", "0", "-n", str(n), "-t",
                          str(threads), "-r", str(repeats), "-o", "csv"], capture_output=True, text=True, check=True)
    rows = [line for line in out.stdout.splitlines() if line and not line.startswith("build_commit")]
    header = out.stdout.splitlines()[0].split(",")
    col = header.index('"avg_ts"') if '"avg_ts"' in header else header.index("avg_ts")
    return float(rows[-1].split(",")[col].strip('"'))


def llama_spec(bin_dir: str, model: str, draft: str | None, prompt_text: str, threads: int, max_tokens: int,
               draft_max: int) -> dict:
    """One greedy speculative run of llama.cpp on prompt_text: decode tokens per second and acceptance."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt_text)
    try:
        common = ["-m", model, "-f", f.name, "-n", str(max_tokens), "-t", str(threads), "-tb", str(threads),
                  "--temp", "0", "-c", "4096", "--spec-draft-n-max", str(draft_max)]
        if draft:
            cmd = [os.path.join(bin_dir, "llama-speculative-simple"), *common, "-md", draft, "--spec-type", "draft-simple",
                   "-td", str(threads), "-tbd", str(threads)]
        else:
            cmd = [os.path.join(bin_dir, "llama-lookup"), *common]
        r = subprocess.run(cmd, capture_output=True, text=True)
        log = r.stdout + r.stderr
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"{os.path.basename(cmd[0])} failed:\n{log[-2000:]}")
        drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", log).group(1))
        accepted = int(re.search(r"n_accept\s*=\s*(\d+)", log).group(1))
        return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "drafted": drafted, "accepted": accepted,
                "command": " ".join(os.path.basename(c) if c == cmd[0] else c for c in cmd if c != f.name)}
    finally:
        os.unlink(f.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--draft", help="Draft model (catalog name or path).")
    how.add_argument("--lookup", action="store_true", help="Prompt-lookup speculation.")
    ap.add_argument("--prompts", required=True, help="A JSON prompt file (see edgeinfer bench --spec-prompts).")
    ap.add_argument("--draft-tokens", type=int, default=0, help="Proposals per step at most (0: the default).")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin", default=None, help="A llama.cpp build's bin directory, for its figures.")
    ap.add_argument("--llama-draft-max", type=int, default=0,
                    help="llama.cpp's --spec-draft-n-max (default: the same cap as ours).")
    args = ap.parse_args()

    prompts = load_spec_prompts(args.prompts)
    kw = dict(draft=args.draft) if args.draft else dict(speculate="lookup")
    llm = LLM(args.model, threads=args.threads, progress=True, draft_tokens=args.draft_tokens, **kw)
    print(f"edgeinfer: {args.model} with {'draft ' + args.draft if args.draft else 'prompt lookup'}, "
          f"{len(prompts)} prompts x {args.max_tokens} tokens, {args.threads} threads", flush=True)
    ours = spec_compare(llm, prompts, repeats=args.repeats, max_tokens=args.max_tokens,
                        say=lambda s: print(f"  {s}", flush=True))
    result = {"model": args.model, "draft": args.draft, "method": "draft" if args.draft else "lookup",
              "prompts_file": os.path.basename(args.prompts), "threads": args.threads, "max_tokens": args.max_tokens,
              "system": system_info(), "edgeinfer": ours}
    print(f"edgeinfer: without {ours['decode_tok_s_without']:.2f} tok/s, with {ours['decode_tok_s_with']:.2f} tok/s "
          f"({ours['speedup']:.2f}x); acceptance {ours['acceptance_rate']:.1%}; identical output: "
          f"{ours['identical_output']}", flush=True)

    if args.llama_bin:
        # the same prompt text llama.cpp tokenizes itself (the chat template rendered by ours)
        texts = [llm.detokenize(_prompt_ids(llm, p)) for p in prompts]
        bos = llm.tokenizer.bos_id
        if bos is not None and llm.tokenizer.add_bos:  # llama.cpp adds the BOS itself
            texts = [t[len(llm.tokenizer.tokens[bos]):] if t.startswith(llm.tokenizer.tokens[bos]) else t
                     for t in texts]
        target = str(registry.resolve(args.model, progress=False))
        draft = str(registry.resolve(args.draft, progress=False)) if args.draft else None
        del llm  # free the memory and the cores
        plain = llama_plain_tg(args.llama_bin, target, args.threads, args.max_tokens, args.repeats)
        runs = []
        for r in range(args.repeats):
            print(f"  llama.cpp speculative: run {r + 1}/{args.repeats}", flush=True)
            res = [llama_spec(args.llama_bin, target, draft, t, args.threads, args.max_tokens,
                              args.llama_draft_max or ours["max_draft_tokens"])
                   for t in texts]
            runs.append(res)
        rates = [sum(x["tokens"] for x in res) / sum(x["seconds"] for x in res) for res in runs]
        drafted = sum(x["drafted"] for x in runs[0])
        accepted = sum(x["accepted"] for x in runs[0])
        spec = statistics.median(rates)
        result["llama_cpp"] = {"decode_tok_s_plain": round(plain, 2), "decode_tok_s_speculative": round(spec, 2),
                               "speedup": round(spec / plain, 3), "drafted": drafted, "accepted": accepted,
                               "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
                               "runs": [round(x, 2) for x in rates], "command": runs[0][0]["command"],
                               "plain_command": f"llama-bench -p 0 -n {args.max_tokens} -t {args.threads}"}
        result["edgeinfer_over_llama_cpp_speculative"] = round(ours["decode_tok_s_with"] / spec, 3)
        lc = result["llama_cpp"]
        print(f"llama.cpp: plain {lc['decode_tok_s_plain']:.2f} tok/s, speculative {lc['decode_tok_s_speculative']:.2f} "
              f"tok/s ({lc['speedup']:.2f}x); acceptance {lc['acceptance_rate']:.1%}")
        print(f"edgeinfer with speculation / llama.cpp with speculation: {result['edgeinfer_over_llama_cpp_speculative']:.2f}")
    save(f"spec-{args.model}", result)


if __name__ == "__main__":
    main()
