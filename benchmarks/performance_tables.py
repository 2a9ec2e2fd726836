"""The tables of docs/performance.md, in Markdown, from the JSON of benchmarks/performance.sh.

    python benchmarks/performance_tables.py [results/performance]

Every number of the page's tables is printed here from the files `splitformer bench` wrote
(results/performance/<suite>-<size>.json); nothing is measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from splitformer.bench.timing import ms


def load(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def by(rows, *keys):
    out: dict = {}
    for r in rows:
        if "median_s" in r or "peak_bytes" in r:
            out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def header(cols: list[str]) -> str:
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def machine(data: dict) -> None:
    m = next(iter(data.values()))["machine"]
    print(f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['torch_threads']} torch threads, "
          f"torch {m['torch']}, Python {m['python']}.")
    peaks = sorted({round(r["peak_flops_per_s"] / 1e9, 1) for d in data.values()
                    for r in d["rows"] if "peak_flops_per_s" in r})
    if peaks:
        print(f"Measured float32 matmul peak (2048 x 2048 torch.mm, median, in each run): "
              f"{', '.join(f'{p:g}' for p in peaks)} GFLOP/s.")
    print()


def encoder(d: dict, title: str) -> None:
    rows = d["rows"]
    paths = [p for p in ("train", "eval", "no_grad", "inference")
             if any(r.get("path") == p for r in rows)]
    print(f"#### {title}\n")
    print(header(["group", "contender", *[f"{p} (ms)" for p in paths],
                  *[f"splitformer / this, {p}" for p in paths]]))
    for r in rows:
        if "skipped" in r or "error" in r:
            print(f"| {r.get('group', '')} | {r.get('skipped') or r.get('error')} |"
                  + " |" * (2 * len(paths)))
    groups = by(rows, "size", "group")
    several = len({size for size, _ in groups}) > 1
    for (size, group), rs in groups.items():
        group = f"{size} {group}" if several else group
        names = list(dict.fromkeys(r["name"] for r in rs))
        t = {(r["name"], r["path"]): r for r in rs}
        ours = [n for n in names if any(t[(n, p)].get("splitformer") for p in paths
                                        if (n, p) in t)]
        for n in names:
            cells = [ms(t[(n, p)]["median_s"]) if (n, p) in t else "" for p in paths]
            if n in ours:
                ratio = [""] * len(paths)
            else:
                o = ours[0]
                ratio = [f"**{t[(o, p)]['median_s'] / t[(n, p)]['median_s']:.3f}**"
                         if (n, p) in t and (o, p) in t else "" for p in paths]
            print(f"| {group} | {n} | " + " | ".join(cells + ratio) + " |")
    print()


def schemes(d: dict) -> None:
    rows = d["rows"]
    print(header(["pair", "contender", "parameters", "path", "ms", "ratios (this / other)"]))
    for r in rows:
        if "skipped" in r or "error" in r:
            print(f"| {r.get('group', '')} | {r.get('skipped') or r.get('error')} | | | | |")
            continue
        ratios = ", ".join(f"{v:.3f}x {k}" for k, v in r["ratios"].items())
        print(f"| {r['group']} | {r['name']} | {r['parameters']:,} | {r['path']} | "
              f"{ms(r['median_s'])} | {ratios} |")
    print()


def costs(d: dict) -> None:
    rows = [r for r in d["rows"] if "median_s" in r]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    t = {(r["name"], r["path"]): r for r in rows}
    names = list(dict.fromkeys(r["name"] for r in rows))
    print(header(["scheme, integrator", "field evaluations per step",
                  *[f"{p}: ms, vs Lie" for p in paths]]))
    for n in names:
        r0 = t[(n, paths[0])]
        cells = []
        for p in paths:
            r = t[(n, p)]
            cells.append(f"{ms(r['median_s'])}, {r['ratios'].get('lie', 1.0):.2f}x")
        print(f"| {n} | {r0['note']} | " + " | ".join(cells) + " |")
    for r in d["rows"]:
        if "skipped" in r:
            print(f"| {r['group']} | refused: {r['skipped']} |" + " |" * len(paths))
    print()


def refine(d: dict) -> None:
    rows = [r for r in d["rows"] if "median_s" in r]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    t = {(r["k"], r["path"]): r for r in rows}
    ks = sorted({r["k"] for r in rows})
    print(header(["k", "N_t", *[f"{p}: ms, ms per step, vs k = 1" for p in paths]]))
    for k in ks:
        cells = []
        for p in paths:
            r, r1 = t[(k, p)], t[(ks[0], p)]
            cells.append(f"{ms(r['median_s'])}, {ms(r['per_step_s'])}, "
                         f"{r['median_s'] / r1['median_s']:.2f}x")
        print(f"| {k} | {t[(k, paths[0])]['num_steps']} | " + " | ".join(cells) + " |")
    print()


def seq(d: dict) -> None:
    rows = [r for r in d["rows"] if "median_s" in r]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    t = {(r["seq"], r["name"], r["path"]): r for r in rows}
    seqs = sorted({r["seq"] for r in rows})
    print(header(["seq", "batch", *[f"{p}: torch.nn ms, splitformer ms, ratio" for p in paths]]))
    for n in seqs:
        cells = []
        for p in paths:
            a, b = t[(n, "torch.nn", p)], t[(n, "splitformer", p)]
            cells.append(f"{ms(a['median_s'])}, {ms(b['median_s'])}, "
                         f"**{b['median_s'] / a['median_s']:.3f}**")
        print(f"| {n} | {t[(n, 'torch.nn', paths[0])]['batch']} | " + " | ".join(cells) + " |")
    print()


def memory(d: dict) -> None:
    print(header(["size", "contender", "peak MiB", "this / torch.nn"]))
    for r in d["rows"]:
        if "peak_bytes" not in r:
            continue
        ratio = r["ratios"].get("torch.nn")
        print(f"| {r['size']} | {r['name']} ({r['note']}) | {r['peak_bytes'] / 2**20:,.1f} | "
              f"{'' if ratio is None else f'**{ratio:.3f}**'} |")
    print()


def flops(d: dict, compiled: bool = False) -> None:
    cols = ["size", "path", "contender", "ms", "GFLOP/s", "% of matmul peak"]
    if compiled:
        cols += ["/ eager", "/ torch.nn compiled", "compile s"]
    print(header(cols))
    for r in d["rows"]:
        if "median_s" not in r:
            continue
        cells = [r["size"], r["path"], r["name"], ms(r["median_s"]),
                 f"{r['flops_per_s'] / 1e9:,.1f}", f"{100 * r['fraction_of_peak']:.1f}"]
        if compiled:
            base = r["name"].removesuffix(" compiled")
            eager = r["ratios"].get(base, "") if r["name"] != base else ""
            other = ("torch.nn compiled" if r["name"] == "splitformer compiled" else None)
            vs = r["ratios"].get(other) if other else None
            cells += [f"{eager:.3f}" if eager != "" else "",
                      f"**{vs:.3f}**" if vs is not None else "",
                      f"{r['compile_s']:.1f}" if "compile_s" in r else ""]
        print("| " + " | ".join(cells) + " |")
    print()


def generate(d: dict) -> None:
    """generate on the KV tape against transformers' generate, and the linear-kernel rows."""
    rows = [r for r in d["rows"] if "median_s" in r]
    pairs = [r for r in rows if r["group"].startswith("generate ")]
    if pairs:
        print(header(["dtype", "contender", "prefill (tokens/s)", "decode (tokens/s)",
                      "splitformer / transformers: prefill, decode", "KV bytes / token",
                      "same ids"]))
        for r in pairs:
            ratio = (f"{r['prefill_ratio']:.3f}, {r['decode_ratio']:.3f}"
                     if r["splitformer"] else "")
            print(f"| {r['dtype']} | {r['name']} | {r['prefill_tokens_per_s']:,.0f} | "
                  f"{r['decode_tokens_per_s']:,.1f} | {ratio} | "
                  f"{r['cache_bytes_per_token']:,.0f} | {'yes' if r['same_ids'] else 'no'} |")
        print()
        notes = sorted({r["note"].split(";")[0] for r in pairs if r.get("weights")})
        if notes:  # the Llama sizes say which weights they ran on
            print(f"Weights: {', '.join(notes)}; prompt {pairs[0]['prompt']} tokens, "
                  f"{pairs[0]['new_tokens']} new tokens.\n")
    lin = [r for r in rows if r["group"] == "linear decode"]
    if lin:
        print(header(["kernel", "prefix (tokens)", "decode step (ms)", "tokens/s",
                      "tape (MiB)"]))
        for r in lin:
            print(f"| {r['kernel']} | {r['prefix']} | {ms(r['median_s'])} | "
                  f"{r['decode_tokens_per_s']:,.1f} | {r['cache_bytes'] / 2**20:,.2f} |")
        print()


TABLES = {  # suite -> its table
    "encoder": encoder,
    "schemes": lambda d, name: schemes(d),
    "costs": lambda d, name: costs(d),
    "refine": lambda d, name: refine(d),
    "seq": lambda d, name: seq(d),
    "memory": lambda d, name: memory(d),
    "flops": lambda d, name: flops(d),
    "compile": lambda d, name: flops(d, compiled=True),
    "generate": lambda d, name: generate(d),
}


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    folder = Path(args[0] if args else "results/performance")
    if len(args) > 1 or not folder.is_dir():
        print(f"performance_tables: expected one folder of `splitformer bench` JSON files, got "
              f"{' '.join(args)!r}", file=sys.stderr)
        return 2
    data = {name: d for name, d in load(folder).items()
            if isinstance(d, dict) and isinstance(d.get("suites"), list) and "rows" in d}
    if not data:
        print(f"performance_tables: no `splitformer bench` JSON in {folder}: run "
              "benchmarks/performance.sh first", file=sys.stderr)
        return 2
    machine(data)
    for name, d in data.items():
        print(f"### {name}: `{d['command']}`\n")
        for suite in d["suites"]:  # a file may hold several suites: one table each
            if suite not in TABLES:
                print(f"(no table for suite {suite!r})\n")
                continue
            TABLES[suite]({**d, "rows": [r for r in d["rows"] if r.get("suite") == suite]},
                          name)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
