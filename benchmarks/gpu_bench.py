"""GPU benchmark: splitformer against torch.nn on one CUDA device, pairs timed in one process.

    python benchmarks/gpu_bench.py [--out gpu_bench.json] [--repeats 5] [--sizes d256,d768]
    python benchmarks/gpu_bench.py --dry-run --out /tmp/gpu_bench.json   # CPU, tiny size

Sizes: the networks of ``splitformer.bench.sizes.SIZES`` "d256" and "d768" with GPU batches,
named apart from the CPU sizes (whose batch and seq differ) in the tables and the JSON:

    gpu-d256   d256's network (d 256 / 8 heads / 6 layers / ff 1024), batch 128 / seq 256
    gpu-d768   d768's network (d 768 / 12 heads / 12 layers / ff 3072), batch 64 / seq 512

``--sizes`` takes d256 and d768 (as before the renaming) or the gpu- names for them.

What it measures (``splitformer.bench.timing``: repeats interleaved, medians, CUDA synchronised),
``splitformer.from_torch(nn.TransformerEncoder(...))`` (the Lie scheme) against that encoder at
every size, both built by ``splitformer.bench.peers.torch_layers`` (seed 0, ReLU, dropout 0):

    peaks          square matmul FLOP/s in float32 and bfloat16 (``timing.matmul_peak``)
    fp32           float32, paths train (forward + backward) and no_grad
    bf16_autocast  torch.autocast(bfloat16) around the forward, SDPA restricted to the flash and
                   memory-efficient kernels; a probe with flash alone says whether flash was refused
    bf16_cast      both models cast to bfloat16, inference path, same SDPA restriction
    cuda_graphs    inference replayed from a torch.cuda.CUDAGraph captured on static inputs,
                   float32 and bfloat16, next to eager (CUDA only)
    schemes        under bf16 autocast: Strang with Euler substeps on the pre-LN network with
                   half-width FFNs (Macaron parity), built as ``bench.scheme_peers.strang_macaron``
                   builds it (``torch_layers(size, ff // 2, norm_first=True)``, then
                   ``.with_scheme("strang", integrator="euler")``) so that its ratio to Lie (the
                   post-LN network, full ff) compares with the CPU schemes suite's; pre-norm and
                   its Heun/RK2 version; all as ratios to Lie (flops_ratio: the FLOP count's ratio)
    memory         peak bytes of one training step, float32 and bf16 autocast (``peak_memory``)
    compile        torch.compile(fullgraph=True) of both models, train and no_grad, compiled
                   against compiled (and against eager); at the first size only (compiling costs
                   far more than timing)
    flops          achieved forward FLOP/s (``Size.forward_flops``) as a fraction of the matmul
                   peak of the same dtype, from the no_grad / inference rows above

It prints tables and writes JSON (device, torch version, sizes, every row; rewritten atomically
after every part). A part that fails records its error and the others still run (exit code 1
then). Parts not started when --budget-s seconds have passed are recorded as skipped.

Time: estimated at 2-4 minutes on one H200 with the defaults, most of it torch.compile (an
estimate from FLOP counts: not yet timed on a GPU); parts not started by --budget-s 240 are
skipped, to stay under 5. ``--dry-run`` forces the CPU, the "tiny" size, at most 2 repeats,
skips the CUDA graphs (recorded as skipped rows) and compiles with the "eager" backend: about
5-15 seconds. Without --dry-run and without CUDA it exits 2 ("no CUDA device; use --dry-run").

Errors are one line on stderr, never a traceback: a bad argument names it and what was expected
(exit 2; --out is checked before any work: a file name, in a folder that exists -- missing
folders are refused, not created -- and where a file can be created); Ctrl-C prints
"gpu_bench: interrupted" and where the JSON of the finished parts is, if any was written (exit
130); a failed write of the JSON says why (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

PROG = "gpu_bench"


def _import_library():
    try:
        import splitformer  # noqa: F401
    except ImportError:  # run from a checkout without the package installed
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


try:  # loading torch takes a second or two: Ctrl-C then is one line too
    import torch
    from torch import nn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _import_library()

    import splitformer
    from splitformer.bench import peers, timing
    from splitformer.bench import sizes as sizes_mod
    from splitformer.bench.peers import reason
    from splitformer.commands import positive_int
    from splitformer.commands.bench import write_json
except KeyboardInterrupt:
    if __name__ != "__main__":
        raise
    sys.stderr.write(f"{PROG}: interrupted\n")
    sys.exit(130)

PARTS = ("peaks", "fp32", "bf16_autocast", "bf16_cast", "cuda_graphs", "schemes", "memory",
         "compile", "flops")
# --sizes name -> (name in the tables and the JSON, batch, seq); the network is SIZES[name]'s
GPU_SIZES = {"d256": ("gpu-d256", 128, 256), "d768": ("gpu-d768", 64, 512)}
GPU_SIZE_NAMES = tuple(name for name, _, _ in GPU_SIZES.values())


# --------------------------------------------------------------------------------------------
# arguments (checked before CUDA is touched)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.exit(2)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _subset(choices: tuple[str, ...], aliases: dict[str, str] | None = None):
    """argparse type: distinct names from ``choices``, each read through ``aliases`` (another
    accepted name -> its choice)."""
    aliases = aliases or {}

    def parse(text: str) -> list[str]:
        names = [aliases.get(t, t) for t in (t.strip() for t in text.split(",")) if t]
        bad = [n for n in names if n not in choices]
        if not names or bad or len(set(names)) != len(names):
            shown = [a for a in aliases if aliases[a] in choices] or list(choices)
            raise argparse.ArgumentTypeError(
                f"must be distinct names from {','.join(shown)}, got {text!r}")
        return names
    return parse


def _out_problem(value: str) -> str | None:
    """What is wrong with ``--out value`` (None: nothing): it must name a file (not a folder)
    in a folder that exists (a missing one is refused, not created) and where a file can be
    created, which is tried with a temporary file, deleted at once."""
    path = Path(value)
    if not value.strip() or value.endswith(os.sep) or path.is_dir():
        return f"expected a file name, not a folder, got {value!r}"
    if path.exists() and not path.is_file():
        return f"expected a regular file, got {value!r}"
    folder = path.parent  # Path("x.json").parent is Path(".")
    if not folder.is_dir():
        if folder.exists():
            return f"{str(folder)!r} is not a folder"
        return f"folder {str(folder)!r} does not exist"
    try:
        with tempfile.NamedTemporaryFile(prefix=f".{PROG}-", suffix=".json", dir=folder):
            pass
    except OSError as e:
        return f"cannot create a file in folder {str(folder)!r} ({e.strerror or e})"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog=PROG, description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, tiny size, 2 repeats, no CUDA graphs: checks every code path")
    p.add_argument("--out", default="gpu_bench.json", help="JSON file (default gpu_bench.json)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed repeats per contender (default 5; the dry run takes at most 2)")
    p.add_argument("--sizes", default=list(GPU_SIZE_NAMES),
                   type=_subset(GPU_SIZE_NAMES, {k: v[0] for k, v in GPU_SIZES.items()}),
                   help="comma-separated subset of d256,d768: the sizes gpu-d256 and gpu-d768 "
                        "(which these names also select; default both)")
    p.add_argument("--parts", type=_subset(PARTS), default=list(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default all)")
    p.add_argument("--budget-s", type=_positive_float, default=240.0,
                   help="parts not started after this many seconds are skipped (default 240)")
    args = p.parse_args(argv)
    problem = _out_problem(args.out)
    if problem:
        p.error(f"argument --out: {problem}")  # one line, exit 2
    return args


# --------------------------------------------------------------------------------------------
# the benchmark

def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


class WriteError(Exception):
    """The JSON could not be written (the message is the one line main prints)."""


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.splitformer, self.timing = splitformer, timing
        self.backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        self.flash_only = [SDPBackend.FLASH_ATTENTION]
        self.args = args
        self.dry = args.dry_run
        self.cuda = not self.dry
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.repeats = min(args.repeats, 2) if self.dry else args.repeats
        self.warmup = 1 if self.dry else 2
        if self.dry:
            self.sizes = [sizes_mod.SIZES["tiny"]]
        else:
            gpu = {name: replace(sizes_mod.SIZES[cpu], batch=batch, seq=seq, name=name)
                   for cpu, (name, batch, seq) in GPU_SIZES.items()}
            self.sizes = [gpu[n] for n in args.sizes]
        self.compile_backend = "eager" if self.dry else "inductor"
        self.t0 = time.perf_counter()
        self.written = False  # whether the JSON was written (Ctrl-C says where it is then)
        self.rows: list[dict] = []
        self.parts: dict[str, str] = {}
        self.flash: dict[str, dict[str, str]] = {}
        self.peaks: dict[str, float] = {}
        self._models: dict[tuple, object] = {}
        self._inputs: dict[tuple, object] = {}
        if self.cuda:
            name = torch.cuda.get_device_name(self.device)
        else:
            name = f"cpu ({platform.processor() or platform.machine()}, dry run)"
        self.meta = {
            "device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "dry_run": self.dry, "repeats": self.repeats,
            "warmup": self.warmup, "threads": torch.get_num_threads(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "compile_backend": self.compile_backend,
            "sdpa_backends": [b.name for b in self.backends],
            "sizes": {s.name: {**s.as_dict(), "forward_flops": s.forward_flops()}
                      for s in self.sizes},
        }
        if self.dry and args.sizes != list(GPU_SIZE_NAMES):
            self.meta["note"] = "--sizes ignored by --dry-run (it runs the tiny size)"

    # ---- bookkeeping ------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, text: str) -> None:
        print(f"{PROG}: [{self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)

    def document(self) -> dict:
        return {**self.meta, "matmul_peak_flops": self.peaks, "flash": self.flash,
                "parts": self.parts, "wall_s": self.elapsed(), "rows": self.rows}

    def save(self) -> None:
        """Rewrites the JSON (atomically); an OSError becomes a WriteError (main: one line)."""
        try:
            write_json(Path(self.args.out), _finite(self.document()))
        except OSError as e:
            raise WriteError(f"cannot write {self.args.out}: {e.strerror or e}") from None
        self.written = True

    @contextlib.contextmanager
    def guard(self, part: str, size=None):
        """Runs a piece of ``part``; an exception becomes an error row and the run goes on."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the run
            where = f" at {size.name}" if size is not None else ""
            self.rows.append({"part": part, "size": getattr(size, "name", None),
                              "status": "error", "error": reason(e)})
            self.parts[part] = f"error{where}: {reason(e)}"
            self.log(f"{part}{where} failed: {reason(e)}")
            if self.cuda:
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()

    def skip(self, part: str, reason: str, **fields) -> None:
        self.rows.append({"part": part, **fields, "status": "skipped", "reason": reason})

    # ---- models and inputs ------------------------------------------------------------------

    def encoder_pair(self, size, *, ff: int | None = None, norm_first: bool = False):
        """(torch.nn encoder, splitformer.from_torch of it), on the device: built by
        ``peers.torch_layers`` (seed 0) on the CPU, then moved."""
        key = ("pair", size.name, ff or size.ff, norm_first)
        if key not in self._models:
            ref = peers.torch_layers(size, ff or size.ff, norm_first, 0).to(self.device)
            ours = self.splitformer.from_torch(ref).to(self.device)
            self._models[key] = (ref, ours)
        return self._models[key]

    def bf16_pair(self, size):
        key = ("bf16", size.name)
        if key not in self._models:
            ref, _ = self.encoder_pair(size)
            ref16 = copy.deepcopy(ref).to(torch.bfloat16)
            ours16 = self.splitformer.from_torch(ref16).to(self.device, torch.bfloat16)
            self._models[key] = (ref16, ours16)
        return self._models[key]

    def x(self, size, dtype=None):
        dtype = dtype or torch.float32
        key = (size.name, dtype)
        if key not in self._inputs:
            g = torch.Generator().manual_seed(1)
            x = torch.randn(size.batch, size.seq, size.dim, generator=g)
            self._inputs[key] = x.to(self.device, dtype)
        return self._inputs[key]

    def wrap(self, model, *, autocast: bool, restrict: bool = True):
        return Precision(model, self.device.type, torch.bfloat16 if autocast else None,
                         self.backends if restrict else None)

    def contender(self, name, model, x, note=""):
        return self.timing.Contender(name, model, (x,), note=note)

    # ---- timing rows ------------------------------------------------------------------------

    def timed(self, part, size, setting, path, contenders, baselines, extra=None, warmup=None):
        """Times ``contenders`` on ``path`` (interleaved) and adds a row per contender: median,
        min, max, the repeats, and ratio = median / median of ``baselines[name]``."""
        res = self.timing.measure(contenders, path, repeats=self.repeats,
                                  warmup=self.warmup if warmup is None else warmup)
        for c in contenders:
            r = res[c.name]
            base = baselines.get(c.name, c.name)
            row = {"part": part, "size": size.name, "setting": setting, "path": path,
                   "contender": c.name, "status": "ok", "median_s": r["median_s"],
                   "min_s": r["min_s"], "max_s": r["max_s"], "times_s": r["times_s"],
                   "baseline": base, "ratio": r["median_s"] / res[base]["median_s"],
                   "note": c.note}
            row.update((extra or {}).get(c.name, {}))
            self.rows.append(row)
        return res

    # ---- parts ------------------------------------------------------------------------------

    def part_peaks(self) -> None:
        n = 256 if self.dry else 8192
        for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            with self.guard("peaks"):
                flops = self.timing.matmul_peak(n, max(self.repeats, 3), self.device, dtype)
                self.peaks[label] = flops
                self.rows.append({"part": "peaks", "dtype": label, "n": n, "status": "ok",
                                  "flops_per_s": flops})

    def part_fp32(self) -> None:
        for size in self.sizes:
            with self.guard("fp32", size):
                ref, ours = self.encoder_pair(size)
                x = self.x(size)
                cs = [self.contender("torch.nn", ref, x, "nn.TransformerEncoder"),
                      self.contender("splitformer", ours, x, "from_torch: Lie scheme")]
                for path in ("train", "no_grad"):
                    self.timed("fp32", size, "fp32", path, cs, {"splitformer": "torch.nn"})

    def flash_probe(self, size) -> dict[str, str]:
        """Per model: does a training step run with SDPA restricted to flash attention alone?"""
        out = {}
        for name, model in zip(("torch.nn", "splitformer"), self.encoder_pair(size),
                               strict=True):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    model.train()
                    with torch.autocast(self.device.type, dtype=torch.bfloat16), \
                            sdpa_kernel(self.flash_only):
                        y = model(self.x(size))
                    y.float().square().mean().backward()
                    out[name] = "ok"
                except RuntimeError as e:
                    why = [str(w.message).strip().splitlines()[0] for w in caught
                           if "flash" in str(w.message).lower()]
                    out[name] = "refused: " + ("; ".join(why)[:400] or reason(e))
                finally:
                    model.zero_grad(set_to_none=True)
        self.flash[size.name] = out
        for name, verdict in out.items():
            if verdict != "ok":
                self.log(f"flash attention refused for {name} at {size.name}: {verdict}")
        return out

    def part_bf16_autocast(self) -> None:
        for size in self.sizes:
            with self.guard("bf16_autocast", size):
                flash = self.flash_probe(size)
                ref, ours = self.encoder_pair(size)
                x = self.x(size)
                cs = [self.contender(name, self.wrap(m, autocast=True), x,
                                     f"autocast bf16, flash: {flash[name]}")
                      for name, m in (("torch.nn", ref), ("splitformer", ours))]
                for path in ("train", "no_grad"):
                    self.timed("bf16_autocast", size, "bf16-autocast", path, cs,
                               {"splitformer": "torch.nn"})

    def part_bf16_cast(self) -> None:
        for size in self.sizes:
            with self.guard("bf16_cast", size):
                ref16, ours16 = self.bf16_pair(size)
                x = self.x(size, torch.bfloat16)
                cs = [self.contender(name, self.wrap(m, autocast=False), x, "model in bf16")
                      for name, m in (("torch.nn", ref16), ("splitformer", ours16))]
                self.timed("bf16_cast", size, "bf16", "inference", cs,
                           {"splitformer": "torch.nn"})

    def part_cuda_graphs(self) -> None:
        if not self.cuda:
            self.parts["cuda_graphs"] = "skipped: needs CUDA"
        for size in self.sizes:
            for setting in ("fp32", "bf16"):
                if not self.cuda:
                    self.skip("cuda_graphs", "skipped: needs CUDA", size=size.name,
                              setting=setting)
                    continue
                with self.guard("cuda_graphs", size):
                    self._cuda_graphs(size, setting)
                torch.cuda.empty_cache()

    def _cuda_graphs(self, size, setting) -> None:
        if setting == "fp32":
            pair, x = self.encoder_pair(size), self.x(size)
        else:
            pair, x = self.bf16_pair(size), self.x(size, torch.bfloat16)
        eager = dict(zip(("torch.nn", "splitformer"),
                         (self.wrap(m, autocast=False, restrict=setting != "fp32") for m in pair),
                         strict=True))
        graphs = {}
        for name, m in eager.items():
            try:
                graphs[name] = GraphReplay(m, x)
            except Exception as e:  # noqa: BLE001 - recorded, the other model still runs
                self.rows.append({"part": "cuda_graphs", "size": size.name, "setting": setting,
                                  "contender": f"{name} graph", "status": "error",
                                  "error": reason(e)})
                self.parts["cuda_graphs"] = f"error: {name}: {reason(e)}"
                self.log(f"CUDA graph capture of {name} failed: {reason(e)}")
        cs = [self.contender(n, m, x, "eager") for n, m in eager.items()]
        cs += [self.contender(f"{n} graph", g, x, "CUDAGraph replay") for n, g in graphs.items()]
        base = {"splitformer": "torch.nn"}
        if len(graphs) == 2:
            base["splitformer graph"] = "torch.nn graph"
        res = self.timed("cuda_graphs", size, setting, "inference", cs, base)
        for row in self.rows[-len(cs):]:
            if row["contender"].endswith(" graph"):
                eager_s = res[row["contender"].removesuffix(" graph")]["median_s"]
                row["speedup_vs_eager"] = eager_s / row["median_s"]
        del graphs, cs

    def part_schemes(self) -> None:
        for size in self.sizes:
            with self.guard("schemes", size):
                _, lie = self.encoder_pair(size)
                # as bench.scheme_peers.strang_macaron: the pre-LN network with ff // 2
                _, half = self.encoder_pair(size, ff=size.ff // 2, norm_first=True)
                strang = half.with_scheme("strang", integrator="euler")
                _, prenorm = self.encoder_pair(size, norm_first=True)
                heun = prenorm.with_scheme("prenorm", integrator="heun")
                base = size.forward_flops()
                flops = {"lie": base,
                         "strang half-ff": replace(size, ff=size.ff // 2).forward_flops(2.0),
                         "prenorm": base, "heun": size.forward_flops(2.0, 2.0)}
                notes = {"lie": "post-LN, Euler",
                         "strang half-ff": f"Strang, Euler substeps, pre-LN, ff {size.ff // 2} "
                                           "(Macaron parity, as scheme_peers.strang_macaron)",
                         "prenorm": "pre-LN, Euler", "heun": "pre-LN, Heun/RK2 substeps"}
                x = self.x(size)
                cs = [self.contender(n, self.wrap(m, autocast=True), x, notes[n])
                      for n, m in (("lie", lie), ("strang half-ff", strang),
                                   ("prenorm", prenorm), ("heun", heun))]
                extra = {n: {"forward_flops": f, "flops_ratio": f / base}
                         for n, f in flops.items()}
                for path in ("train", "no_grad"):
                    res = self.timed("schemes", size, "bf16-autocast", path, cs,
                                     {n: "lie" for n in flops}, extra)
                    self.rows[-1]["vs_prenorm"] = (res["heun"]["median_s"]
                                                   / res["prenorm"]["median_s"])

    def part_memory(self) -> None:
        for size in self.sizes:
            with self.guard("memory", size):
                ref, ours = self.encoder_pair(size)
                x = self.x(size)
                for setting, autocast in (("fp32", False), ("bf16-autocast", True)):
                    peak = {}
                    for name, m in (("torch.nn", ref), ("splitformer", ours)):
                        c = self.contender(name, self.wrap(m, autocast=autocast,
                                                           restrict=autocast), x)
                        step = self.timing.step_fn(c, "train")
                        step()  # lazy workspaces are not the step's memory
                        m.zero_grad(set_to_none=True)
                        peak[name] = self.timing.peak_memory(step, self.device)
                        m.zero_grad(set_to_none=True)
                    for name, b in peak.items():
                        self.rows.append({
                            "part": "memory", "size": size.name, "setting": setting,
                            "path": "train", "contender": name, "status": "ok",
                            "peak_bytes": b, "peak_mib": b / 2 ** 20, "baseline": "torch.nn",
                            "ratio": b / peak["torch.nn"] if peak["torch.nn"] else None})

    def part_compile(self) -> None:
        size = self.sizes[0]
        for other in self.sizes[1:]:
            self.skip("compile", "skipped: compile runs at the first size only",
                      size=other.name)
        with self.guard("compile", size):
            torch._dynamo.reset()
            ref, ours = self.encoder_pair(size)
            x = self.x(size)
            eager = {"torch.nn": ref, "splitformer": ours}
            compiled, compile_s = {}, {}
            for name, m in eager.items():
                cm = torch.compile(m, fullgraph=True, backend=self.compile_backend)
                try:
                    for path in ("train", "no_grad"):
                        c = self.contender(name, cm, x)
                        t = time.perf_counter()
                        self.timing.step_fn(c, path)()
                        if self.cuda:
                            torch.cuda.synchronize()
                        compile_s[(name, path)] = time.perf_counter() - t
                    compiled[name] = cm
                except Exception as e:  # noqa: BLE001 - recorded, the other model still runs
                    self.rows.append({"part": "compile", "size": size.name,
                                      "contender": f"{name} compiled", "status": "error",
                                      "error": reason(e)})
                    self.parts["compile"] = f"error: {name}: {reason(e)}"
                    self.log(f"compile of {name} failed: {reason(e)}")
                finally:
                    m.zero_grad(set_to_none=True)
            cs = [self.contender(n, m, x, "eager") for n, m in eager.items()]
            cs += [self.contender(f"{n} compiled", m, x,
                                  f"torch.compile(fullgraph=True, backend={self.compile_backend})")
                   for n, m in compiled.items()]
            base = {"splitformer": "torch.nn"}
            if len(compiled) == 2:
                base["splitformer compiled"] = "torch.nn compiled"
            for path in ("train", "no_grad"):
                res = self.timed("compile", size, "fp32", path, cs, base)
                for row in self.rows[-len(cs):]:
                    name = row["contender"].removesuffix(" compiled")
                    if row["contender"].endswith(" compiled"):
                        row["speedup_vs_eager"] = res[name]["median_s"] / row["median_s"]
                        row["compile_s"] = compile_s[(name, path)]
            torch._dynamo.reset()

    def part_flops(self) -> None:
        """Achieved forward FLOP/s of the rows timed without autograd, against the peak."""
        with self.guard("flops"):
            sources = {("fp32", "fp32"), ("bf16_autocast", "bf16-autocast"),
                       ("bf16_cast", "bf16"), ("cuda_graphs", "fp32"), ("cuda_graphs", "bf16"),
                       ("compile", "fp32")}
            sizes = {s.name: s for s in self.sizes}
            found = False
            for row in list(self.rows):
                if (row.get("status") != "ok" or row["part"] == "flops"
                        or (row["part"], row.get("setting")) not in sources
                        or row.get("path") not in ("no_grad", "inference")
                        or (row["part"] == "compile"
                            and not row["contender"].endswith(" compiled"))):
                    continue
                dtype = "fp32" if row["setting"] == "fp32" else "bf16"
                if dtype not in self.peaks:
                    continue
                found = True
                flops = sizes[row["size"]].forward_flops()
                rate = flops / row["median_s"]
                self.rows.append({
                    "part": "flops", "size": row["size"], "source": row["part"],
                    "setting": row["setting"], "path": row["path"],
                    "contender": row["contender"], "status": "ok", "forward_flops": flops,
                    "median_s": row["median_s"], "flops_per_s": rate, "peak_dtype": dtype,
                    "peak_flops_per_s": self.peaks[dtype],
                    "fraction": rate / self.peaks[dtype]})
            if not found:
                self.skip("flops", "skipped: no timed forward rows or no matmul peak")

    # ---- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        self.log(f"{self.meta['device']}, torch {torch.__version__}, sizes "
                 f"{', '.join(s.name for s in self.sizes)}, {self.repeats} repeats")
        for part in PARTS:
            if part not in self.args.parts:
                continue
            if part != "flops" and self.elapsed() > self.args.budget_s:
                self.skip(part, f"skipped: --budget-s {self.args.budget_s:g} spent")
                self.parts[part] = "skipped: time budget spent"
                self.log(f"{part}: skipped, --budget-s spent")
                continue
            self.parts[part] = "running"
            self.log(f"{part} ...")
            getattr(self, f"part_{part}")()
            if self.parts[part] == "running":
                self.parts[part] = "ok"
            self.save()
        self.save()
        print_tables(self.document())
        errors = [p for p, s in self.parts.items() if s.startswith("error")]
        self.log(f"done in {self.elapsed():.1f} s; wrote {self.args.out}"
                 + (f"; errors in {', '.join(errors)}" if errors else ""))
        return 1 if errors else 0


class Precision(nn.Module):
    """``model`` called under bf16 autocast (``dtype``) and/or with SDPA restricted to
    ``backends``; the parameters are the model's own."""

    def __init__(self, model, device_type, dtype, backends):
        super().__init__()
        self.model = model
        self.device_type, self.dtype, self.backends = device_type, dtype, backends

    def forward(self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            if self.dtype is not None:
                stack.enter_context(torch.autocast(self.device_type, dtype=self.dtype))
            if self.backends:
                stack.enter_context(sdpa_kernel(self.backends))
            return self.model(*args, **kwargs)


class GraphReplay(nn.Module):
    """Inference of ``model`` on the static input ``x``, captured once in a CUDA graph; calling
    it replays the graph (the argument is ignored: it is ``x``)."""

    def __init__(self, model, x):
        super().__init__()
        self.model = model.eval()  # keeps the parameters visible (device, synchronisation)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.out = model(x)
        torch.cuda.synchronize()

    def forward(self, *args, **kwargs):
        self.graph.replay()
        return self.out


# --------------------------------------------------------------------------------------------
# tables

def _ms(s) -> str:
    return "-" if s is None else f"{1e3 * s:.3f}"


def _num(v, fmt=".3f") -> str:
    return "-" if v is None else format(v, fmt)


def print_tables(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    rows = doc["rows"]
    console.print(f"[bold]{doc['device']}[/bold], torch {doc['torch']} (CUDA {doc['cuda']}), "
                  f"{doc['repeats']} repeats interleaved, medians; sizes: "
                  + "; ".join(f"{n}: d {s['dim']} / h {s['heads']} / L {s['layers']} / "
                              f"ff {s['ff']} / batch {s['batch']} / seq {s['seq']}"
                              for n, s in doc["sizes"].items()))
    for size, verdict in doc["flash"].items():
        for model, v in verdict.items():
            if v != "ok":
                console.print(f"[yellow]flash attention refused[/yellow] for {model} at "
                              f"{size}: {v}")

    t = Table(title="time (ratio: median / median of the baseline, same part, size and path)")
    for col in ("part", "size", "setting", "path", "contender", "median ms", "min-max ms",
                "ratio", "vs", "extra"):
        t.add_column(col, justify="right" if col in ("median ms", "ratio") else "left")
    for r in rows:
        if r.get("status") != "ok" or "median_s" not in r or r["part"] == "flops":
            continue
        extra = []
        for key, label in (("speedup_vs_eager", "x vs eager"), ("flops_ratio", "FLOP ratio"),
                           ("vs_prenorm", "vs prenorm"), ("compile_s", "compile s")):
            if key in r:
                extra.append(f"{label} {r[key]:.2f}")
        t.add_row(r["part"], r["size"], r["setting"], r["path"], r["contender"],
                  _ms(r["median_s"]), f"{_ms(r['min_s'])}-{_ms(r['max_s'])}",
                  _num(r["ratio"]), r["baseline"], ", ".join(extra))
    console.print(t)

    peaks = doc["matmul_peak_flops"]
    if any(r["part"] == "flops" and r.get("status") == "ok" for r in rows):
        t = Table(title="forward FLOP/s against the matmul peak ("
                  + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in peaks.items()) + ")")
        for col in ("size", "from", "setting", "path", "contender", "TFLOP/s", "of peak"):
            t.add_column(col)
        for r in rows:
            if r["part"] == "flops" and r.get("status") == "ok":
                t.add_row(r["size"], r["source"], r["setting"], r["path"], r["contender"],
                          f"{r['flops_per_s'] / 1e12:.3f}", f"{100 * r['fraction']:.1f} %")
        console.print(t)

    mem = [r for r in rows if r["part"] == "memory" and r.get("status") == "ok"]
    if mem:
        t = Table(title="peak memory of one training step")
        for col in ("size", "setting", "contender", "MiB", "ratio"):
            t.add_column(col)
        for r in mem:
            t.add_row(r["size"], r["setting"], r["contender"], f"{r['peak_mib']:.1f}",
                      _num(r["ratio"]))
        console.print(t)

    other = [r for r in rows if r.get("status") in ("skipped", "error")]
    if other:
        t = Table(title="skipped and failed")
        for col in ("part", "size", "setting", "status", "why"):
            t.add_column(col)
        for r in other:
            t.add_row(r["part"], str(r.get("size") or "-"), str(r.get("setting") or "-"),
                      r["status"], r.get("reason") or r.get("error", ""))
        console.print(t)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0, 1 (a part failed, or the JSON could not be written), 2 (a bad argument,
    or no CUDA device without --dry-run), 130 (Ctrl-C); every error is one line on stderr."""
    bench = None
    try:
        args = parse_args(argv)
        if not args.dry_run and not torch.cuda.is_available():
            sys.stderr.write(f"{PROG}: no CUDA device; use --dry-run\n")
            return 2
        bench = Bench(args)
        return bench.run()
    except WriteError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        kept = (f" (the parts finished so far are in {bench.args.out})"
                if bench is not None and bench.written else "")
        sys.stderr.write(f"{PROG}: interrupted{kept}\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
