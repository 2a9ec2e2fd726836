"""What ``splitformer bench`` measures: a registry of suites, each a function of a ``Size``.

Every suite measures its contenders in one process with the repeats interleaved
(``timing.measure``) and returns rows (plain dicts, the JSON of ``splitformer bench``):

    encoder   splitformer against nn.TransformerEncoder (post-LN and pre-LN), Hugging Face
              BertModel (eager and sdpa) and timm's ViT, the same weights (``peers``)
    schemes   Strang at Macaron parity against x-transformers' macaron encoder and Lie; Heun/RK2
              against the ODE Transformer's RK2 block and Lie; parallel against timm's
              parallel-scaling ViT (``scheme_peers``)
    costs     every named scheme and integrator on the same controls against Lie (registry:
              a new scheme is picked up), with its field evaluations per step
    refine    the cost of ``refine(k)``: N_t = k L steps of tau = 1/k on the same controls
    seq       splitformer against torch.nn at sequence lengths 64 .. 1024, tokens per batch fixed
              (up to batch 1)
    memory    peak memory of one training step: torch.nn, and splitformer with each adjoint
              (backprop, checkpoint, reversible on the reversible scheme)
    flops     the forward pass's achieved FLOP/s as a fraction of the machine's float32 matmul
              peak (a 2048 x 2048 ``torch.mm`` measured in the same run), and the training step's
    generate  ``generate`` on the KV tape against transformers' ``generate`` with its cache
              (``bench.generation``): prefill and decode tokens/s, cache memory per token
    compile   ``torch.compile(fullgraph=True)`` of torch.nn and splitformer: compiled against
              eager and compiled against compiled
    merge     token merging at r = ``Options.rs`` per step: the plain ToMe peer over
              transformers' BertModel and splitformer's ``with_token_merging``, throughput
              against r = 0 and the embeddings' mean cosine with the unmerged model, on a
              random-weight BERT at the size (``merge_suite``; ``splitformer bench merge``
              without --size runs the pretrained all-MiniLM-L6-v2: ``experiments.merging``)

A row holds ``suite``, ``size``, ``group`` (the contenders measured together), ``path``,
``name``, ``median_s`` (and ``min_s``, ``max_s``, ``times_s``), ``ratios`` (median over the
median of every other contender of the group), ``parameters`` and ``note``; suites add their own
keys (``peak_bytes``, ``flops``, ``fraction_of_peak``, ``k``, ``seq``, ...). A group whose
reference library does not import is one row with ``skipped`` (the reason). A new suite is a
function added to ``SUITES``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..models.base import EvolutionModel
from . import merge_suite, peers, scheme_peers
from .scheme_peers import PeerUnavailable
from .sizes import Size
from .timing import Contender, matmul_peak, measure, peak_memory, step_fn

__all__ = ["SUITES", "Options", "Suite", "run_suite"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class Options:
    """How to measure: ``repeats`` (>= 1; medians of >= 5 are what docs/performance.md
    reports), ``warmup`` calls before timing, the ``paths`` of the timing suites, ``seed``,
    the refinement factors ``ks``, the sequence lengths ``seqs``, the ``torch.compile``
    backend of the compile suite, and the merge suite's nodes merged per step ``rs`` and
    passage lengths ``tokens`` (on the pretrained model); the generate suite's ``new_tokens``,
    linear-kernel ``prefixes``, and the Llama family's cache rows: ``contexts`` (tokens before
    the timed decode steps), cache ``policies``, their ``budgets`` and ``slack`` (entries above
    the budget before a policy compresses: amortised compression, docs/cache.md)."""

    repeats: int = 5
    warmup: int = 1
    paths: tuple[str, ...] = ("train", "eval", "no_grad")
    seed: int = 0
    ks: tuple[int, ...] = (1, 2, 4)
    seqs: tuple[int, ...] = (64, 128, 256, 512, 1024)
    backend: str = "inductor"
    rs: tuple[int, ...] = (0, 16, 32)
    tokens: tuple[int, ...] = (256,)
    new_tokens: int = 128
    prefixes: tuple[int, ...] = (256, 1024, 4096)
    contexts: tuple[int, ...] = (4096, 8192)
    policies: tuple[str, ...] = ("streaming", "quadrature")
    budgets: tuple[float, ...] = (0.5, 0.25, 0.125)
    slack: int = 0


@dataclass(frozen=True)
class Suite:
    """A suite: its ``run(size, options, say) -> rows`` and the ``paths`` it can measure (of
    those asked for with ``Options.paths``, it measures these)."""

    name: str
    description: str
    run: Callable[[Size, Options, Say], list[dict]]
    paths: tuple[str, ...] = ("train", "eval", "no_grad", "inference")


def _rows(suite: str, size: Size, group: str, path: str, contenders: list[Contender],
          result: dict[str, dict[str, float]], **extra) -> list[dict]:
    rows = []
    for c in contenders:
        r = result[c.name]
        ratios = {o.name: r["median_s"] / result[o.name]["median_s"]
                  for o in contenders if o.name != c.name}
        rows.append({"suite": suite, "size": size.label, "group": group, "path": path,
                     "name": c.name, "splitformer": _ours(c), **r, "ratios": ratios,
                     "parameters": c.parameters, "note": c.note, **extra})
    return rows


def _ours(c: Contender) -> bool:
    """Whether the contender is a splitformer model (compiled or not)."""
    model = getattr(c.model, "module", c.model)
    return isinstance(model, EvolutionModel)


def _skipped(suite: str, size: Size, group: str, reason: str) -> dict:
    return {"suite": suite, "size": size.label, "group": group, "skipped": reason}


def _groups(suite: str, size: Size, opts: Options, say: Say,
            builders: list[tuple[str, Callable[[], list[Contender]]]],
            paths: tuple[str, ...] | None = None) -> list[dict]:
    rows: list[dict] = []
    for group, build in builders:
        try:
            contenders = build()
        except PeerUnavailable as e:
            rows.append(_skipped(suite, size, group, str(e)))
            continue
        for path in paths or opts.paths:
            say(f"{suite} {size.label}: {group}, {path}")
            result = measure(contenders, path, repeats=opts.repeats, warmup=opts.warmup)
            rows += _rows(suite, size, group, path, contenders, result)
        del contenders
    return rows


def encoder(size: Size, opts: Options, say: Say) -> list[dict]:
    """splitformer against torch.nn (post-LN, pre-LN), Hugging Face BERT (eager, sdpa) and
    timm ViT, each pair on the same weights and inputs (``peers``)."""
    s = opts.seed
    return _groups("encoder", size, opts, say, [
        ("torch.nn post-LN", lambda: peers.torch_encoder(size, seed=s)),
        ("torch.nn pre-LN", lambda: peers.torch_encoder(size, norm_first=True, seed=s)),
        ("Hugging Face BERT", lambda: peers.hf_bert(size, seed=s)),
        ("timm ViT", lambda: peers.timm_vit(size, seed=s)),
    ])


def schemes(size: Size, opts: Options, say: Say) -> list[dict]:
    """Strang (Macaron's cost), Heun/RK2 and parallel against the published networks with the
    same splitting (``scheme_peers``)."""
    s = opts.seed
    paths = tuple(p for p in opts.paths if p != "eval")
    return _groups("schemes", size, opts, say, [
        ("Strang / Macaron", lambda: scheme_peers.strang_macaron(size, seed=s)),
        ("Heun / RK2", lambda: scheme_peers.heun_rk2(size, seed=s)),
        ("parallel", lambda: scheme_peers.parallel_block(size, seed=s)),
    ], paths)


EVALUATIONS = {"euler": 1, "heun": 2, "rk2": 2, "rk4": 4}


def field_evaluations(scheme) -> dict[str, int]:
    """How many times one step evaluates each field operator (Euler 1, Heun 2, RK4 4 per
    stage; parallel branches counted too)."""
    counts: dict[str, int] = {}

    def walk(stages):
        for st in stages:
            if st.kind == "parallel":
                for branch in st.branches:
                    walk(branch)
            elif st.kind == "field":
                for f in st.fields():
                    counts[f] = counts.get(f, 0) + EVALUATIONS[st.integrator]

    walk(scheme.stages)
    return counts


def costs(size: Size, opts: Options, say: Say) -> list[dict]:
    """Every named scheme (``time.schemes.scheme_names``) with each integrator on the same
    post-LN controls, against Lie: the cost of a step and the field evaluations behind it.
    A scheme that refuses these controls (the paper's own) is a row saying why."""
    from ..time import INTEGRATORS, scheme_names

    base = peers.torch_encoder(size, seed=opts.seed)[1]
    contenders = [Contender("lie", base.model, base.inputs, note="the network's Lie scheme")]
    skipped = []
    for name in scheme_names():
        refused = []
        integrators = [f.__name__ for f in dict.fromkeys(INTEGRATORS.values())]
        for integrator in integrators:
            label = f"{name} {integrator}"
            if label == "lie euler":
                continue
            try:
                model = base.model.with_scheme(name, integrator=integrator)
            except ValueError as e:  # this integrator, or the scheme on these controls
                refused.append(_skipped("costs", size, label, str(e).splitlines()[0]))
                continue
            ev = field_evaluations(model.evolution.scheme)
            contenders.append(Contender(label, model, base.inputs, note=", ".join(
                f"{k} x{v}" for k, v in ev.items())))
        if len(refused) == len(integrators):  # the scheme itself: one row
            refused = [dict(refused[0], group=name)]
        skipped += refused
    rows = []
    for path in [p for p in opts.paths if p != "eval"]:
        say(f"costs {size.label}: {len(contenders)} schemes, {path}")
        result = measure(contenders, path, repeats=opts.repeats, warmup=opts.warmup)
        for row in _rows("costs", size, "schemes on the Lie network's controls", path,
                         contenders, result):
            row["ratios"] = {"lie": row["ratios"]["lie"]} if row["name"] != "lie" else {}
            rows.append(row)
    return rows + skipped


def refine(size: Size, opts: Options, say: Say) -> list[dict]:
    """The Lie network refined k times (N_t = k L, tau = 1/k): time against k."""
    base = peers.torch_encoder(size, seed=opts.seed)[1]
    contenders = [Contender(f"k={k}", base.model.refine(k), base.inputs,
                            note=f"N_t = {k * size.layers}, tau = 1/{k}") for k in opts.ks]
    rows = []
    for path in [p for p in opts.paths if p != "eval"]:
        say(f"refine {size.label}: k = {', '.join(map(str, opts.ks))}, {path}")
        result = measure(contenders, path, repeats=opts.repeats, warmup=opts.warmup)
        for k, row in zip(opts.ks, _rows("refine", size, "Lie refine(k)", path, contenders,
                                          result), strict=True):
            row.update(k=k, num_steps=k * size.layers,
                       per_step_s=row["median_s"] / (k * size.layers))
            rows.append(row)
    return rows


def seq(size: Size, opts: Options, say: Say) -> list[dict]:
    """torch.nn against splitformer at each length in ``opts.seqs``, batch = max(1,
    size.batch * size.seq // seq): the tokens per batch are held at size.batch * size.seq
    while seq is at most that, and are seq (batch 1) beyond it; each row says its batch and
    ``tokens``."""
    rows = []
    tokens = size.batch * size.seq
    for n in opts.seqs:
        at = replace(size, seq=n, batch=max(1, tokens // n), name="")
        rows += [dict(r, seq=n, batch=at.batch, tokens=at.batch * n) for r in _groups(
            "seq", at, opts, say, [(f"seq {n}", lambda at=at: peers.torch_encoder(
                at, seed=opts.seed))], tuple(p for p in opts.paths if p != "eval"))]
    return rows


def memory(size: Size, opts: Options, say: Say) -> list[dict]:
    """Peak bytes of one training step (forward, loss, backward) above the weights and input."""
    ref, ours = peers.torch_encoder(size, seed=opts.seed)
    model = ours.model
    contenders = [ref, ours,
                  Contender("splitformer checkpoint", model.with_adjoint("checkpoint"),
                            ours.inputs, note="Lie, adjoint 'checkpoint'"),
                  Contender("splitformer reversible", model.with_scheme("reversible")
                            .with_adjoint("reversible"), ours.inputs,
                            note="reversible scheme, adjoint 'reversible'")]
    ours.note = "Lie, adjoint 'backprop'"
    rows = []
    peaks: dict[str, int] = {}
    for c in contenders:
        say(f"memory {size.label}: {c.name}")
        run = step_fn(c, "train")
        run()  # warm: lazily made buffers are not the step's
        c.model.zero_grad(set_to_none=True)
        peaks[c.name] = peak_memory(run)
        c.model.zero_grad(set_to_none=True)
    for c in contenders:
        rows.append({"suite": "memory", "size": size.label, "group": "training step",
                     "path": "train", "name": c.name, "peak_bytes": peaks[c.name],
                     "splitformer": _ours(c),
                     "ratios": {o.name: peaks[c.name] / peaks[o.name] for o in contenders
                                if o.name != c.name and peaks[o.name]},
                     "parameters": c.parameters, "note": c.note})
    return rows


def _peak(opts: Options) -> float:
    return matmul_peak(2048, repeats=max(3, opts.repeats))


def _against_peak(rows: list[dict], peak_runs: list[float]) -> list[dict]:
    """Each row's FLOP/s as a fraction of the median of the matmul peaks measured around it."""
    peak = statistics.median(peak_runs)
    for row in rows:
        row.update(peak_flops_per_s=peak, fraction_of_peak=row["flops_per_s"] / peak)
    return rows


def flops(size: Size, opts: Options, say: Say, *, compiled: bool = False) -> list[dict]:
    """FLOP/s of the forward pass (no_grad) and of the training step (3 x the forward's
    FLOPs: forward, and the two matmuls of the backward per forward matmul; an upper bound by
    the first layer's input gradients of Q, K, V, which autograd skips since the input needs
    no gradient: 6 d^2 per token, 1.3% of the step at d256, 0.6% at d768), as fractions of
    the matmul peak measured before and after (their median)."""
    contenders = peers.torch_encoder(size, seed=opts.seed)
    say(f"flops {size.label}: matmul peak")
    peak_runs = [_peak(opts)]
    fwd = size.forward_flops()
    rows = []
    for path, work in (("no_grad", fwd), ("train", 3 * fwd)):
        if path not in opts.paths:
            continue
        say(f"flops {size.label}: {path}")
        result = measure(contenders, path, repeats=opts.repeats, warmup=opts.warmup)
        for row in _rows("flops", size, "eager", path, contenders, result):
            row.update(flops=work, flops_per_s=work / row["median_s"])
            rows.append(row)
    say(f"flops {size.label}: matmul peak")
    peak_runs.append(_peak(opts))
    return _against_peak(rows, peak_runs)


def _compiled(c: Contender, path: str, backend: str) -> tuple[Contender, float]:
    model = torch.compile(c.model, fullgraph=True, backend=backend)
    wrapped = Contender(f"{c.name} compiled", _Compiled(c.model, model), c.inputs, c.kwargs,
                        c.output, f"torch.compile(fullgraph=True) of {c.name}")
    t0 = time.perf_counter()
    step_fn(wrapped, path)()
    return wrapped, time.perf_counter() - t0


class _Compiled(torch.nn.Module):
    """A compiled callable with its module's parameters and modes (for ``measure``)."""

    def __init__(self, module: torch.nn.Module, compiled) -> None:
        super().__init__()
        self.module = module
        self.__dict__["compiled"] = compiled

    def forward(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)


def compile_suite(size: Size, opts: Options, say: Say) -> list[dict]:
    """Eager and compiled, torch.nn and splitformer, measured together on each path; with the
    FLOP/s of each as a fraction of the matmul peak (measured before and after, as ``flops``)."""
    rows = []
    peak_runs = [_peak(opts)]
    for path in [p for p in opts.paths if p != "eval"]:
        eager = peers.torch_encoder(size, seed=opts.seed)
        compiled = []
        seconds = {}
        for c in eager:
            say(f"compile {size.label}: {c.name}, {path} (compiling)")
            cc, s = _compiled(c, path, opts.backend)
            compiled.append(cc)
            seconds[cc.name] = s
        say(f"compile {size.label}: {path}")
        contenders = [*eager, *compiled]
        result = measure(contenders, path, repeats=opts.repeats, warmup=opts.warmup)
        work = size.forward_flops() * (3 if path == "train" else 1)
        for row in _rows("compile", size, "eager and compiled", path, contenders, result):
            if row["name"] in seconds:
                row["compile_s"] = seconds[row["name"]]
            row.update(flops=work, flops_per_s=work / row["median_s"])
            rows.append(row)
        torch._dynamo.reset()
    peak_runs.append(_peak(opts))
    return _against_peak(rows, peak_runs)


def merge(size: Size, opts: Options, say: Say) -> list[dict]:
    """Token merging on a random-weight transformers BertModel at ``size``: the plain ToMe
    peer and splitformer at each r of ``opts.rs``, with and without proportional attention
    (``merge_suite.merge_rows``)."""
    try:
        workload = merge_suite.random_workload(size, opts.seed)
    except ImportError as e:
        return [_skipped("merge", size, "token merging",
                         f"transformers does not import here: {peers.reason(e)}")]
    return merge_suite.merge_rows(workload, opts.rs, repeats=opts.repeats, warmup=opts.warmup,
                                  say=say)


def generate(size: Size, opts: Options, say: Say) -> list[dict]:
    """Generation on the KV tape against transformers' generate (``bench.generation``):
    prefill and decode tokens/s, float32 and bfloat16, the cache's bytes per token, and the
    linear kernel's decode time against the prefix length."""
    from .generation import generate_rows

    try:
        import transformers  # noqa: F401
    except ImportError as e:
        return [_skipped("generate", size, "generate",
                         f"transformers does not import here: {peers.reason(e)}")]
    return generate_rows(size, opts, say)


_NOT_EVAL = ("train", "no_grad", "inference")  # eval with autograd adds nothing to these

SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("encoder", "splitformer against torch.nn, Hugging Face BERT (eager, sdpa) and timm "
          "ViT: train step, eval, eval under no_grad", encoder),
    Suite("schemes", "Strang vs x-transformers macaron and Lie, Heun vs ODE-Transformer RK2 "
          "and Lie, parallel vs timm parallel-scaling ViT", schemes, _NOT_EVAL),
    Suite("costs", "the cost of a step of every named scheme and integrator against Lie, on "
          "the same controls", costs, _NOT_EVAL),
    Suite("refine", "cost against N_t: refine(k) of the Lie network", refine, _NOT_EVAL),
    Suite("seq", "cost against sequence length (tokens per batch fixed), torch.nn and "
          "splitformer", seq, _NOT_EVAL),
    Suite("memory", "peak memory of one training step (no repeats): torch.nn, splitformer "
          "with each adjoint", memory, ("train",)),
    Suite("flops", "forward and training FLOP/s as a fraction of the measured matmul peak",
          flops, ("train", "no_grad")),
    Suite("compile", "torch.compile(fullgraph=True): compiled against eager and against "
          "compiled torch.nn", compile_suite, _NOT_EVAL),
    Suite("merge", "token merging (ToMe) against r: the plain ToMe peer and splitformer, "
          "throughput and fidelity to the unmerged model (no --size: all-MiniLM-L6-v2)",
          merge, ("no_grad",)),
    Suite("generate", "generation on the KV tape against transformers' generate: prefill and "
          "decode tokens/s, cache bytes per token, linear-kernel decode against the prefix "
          "(no --size: GPT-2 small, prompt 128)", generate, ("no_grad",)),
)}


def run_suite(name: str, size: Size, opts: Options | None = None,
              say: Say | None = None) -> list[dict]:
    """The rows of suite ``name`` at ``size`` (KeyError names the suites if unknown)."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; suites: {sorted(SUITES)}")
    rows = SUITES[name].run(size, opts or Options(), say or (lambda _m: None))
    for row in rows:
        for key in ("median_s", "min_s", "max_s"):
            if key in row and not math.isfinite(row[key]):
                raise FloatingPointError(f"{name}: {row['name']} {key} = {row[key]}")
    return rows
