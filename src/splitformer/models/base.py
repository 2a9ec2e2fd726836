"""The skeleton every model shares: initial condition -> evolution -> read-out.

    (u0, context) = initial_condition(inputs)      u(0) = f, and what shapes the operators
    u(T)          = evolution(u0, context)         the scheme over the time grid
    output        = read_out(u(T), context)        final norm, pooling, head, layout of output

A family supplies ``initial_condition`` and ``read_out`` (and keeps its own ``forward``
signature, e.g. transformers' argument names, delegating to ``solve``); the base supplies the
spine (``solve``), one ``trajectory`` (what to keep is a ``SaveAt``), and the copies made by
``with_scheme`` / ``refine`` / ``with_controls_in_time`` / ``with_kernel`` /
``with_token_merging``: new modules that share every parameter and buffer with the original,
so that ``.train()`` or ``.eval()`` on a copy never changes the original's mode.

Token merging (``with_token_merging``, ``operators.merging``) coarsens the grid inside the
evolution; ``solve`` reads u(T) (and the states kept along the path) back on the input grid
before the read-out, with the input grid put back into the context, so no family's read-out
changes (``unmerge=False``: the read-out sees the merged grid and its weights).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..operators.base import Context
from ..operators.merging import MergeTrace, TokenMerging, trace_of
from ..time import Evolution, SaveAt, Scheme, Trajectory
from .kernels import set_kernel

__all__ = ["EvolutionModel", "RecordSource", "Source", "TorchLayoutReadOut", "keep_source",
           "keep_steps", "path_states", "shared_copy",
           "skeleton_of"]


class Source:
    """Where a model came from, read through two declared members (never by probing):

    * ``kind``: what made it ("layer", "encoder", "decoder_layer", "decoder", "transformer" for
      torch.nn, "hf", "timm", "training"; "" when nothing was recorded);
    * ``field(name, default)``: one recorded value (a typed config's attribute).

    The interop configs (``TorchConfig``, ``HFSource``, ``TimmViTConfig``) derive from it; a
    record kept as a dict is a ``RecordSource``. Every model has one (``EvolutionModel.source``).
    """

    kind: str = ""

    def field(self, name: str, default: Any = None) -> Any:
        """The recorded value ``name`` (``default`` where there is none)."""
        return getattr(self, name, default)


class RecordSource(dict, Source):
    """A source kept as a dict (JSON as it stands): ``field`` is ``get``; ``kind`` is the
    record's "kind" entry (the models' own builders: ``{"kind": "decoder"}``), else "training"
    for the record of a training family (``{"family", "config", "data"}``, no "kind" entry in
    the checkpoint format), else ""."""

    @property
    def kind(self) -> str:  # type: ignore[override]
        return str(self.get("kind") or ("training" if "family" in self else ""))

    def field(self, name: str, default: Any = None) -> Any:
        return self.get(name, default)


def keep_source(source: Any) -> Source:
    """What a model records of where it came from: a ``Source`` (kept as is), a dict (copied
    into a ``RecordSource``) or nothing (an empty one); TypeError for anything else."""
    from collections.abc import Mapping

    if isinstance(source, Source) and not isinstance(source, RecordSource):
        return source
    if source is None or isinstance(source, Mapping):
        return RecordSource(source or {})
    raise TypeError(f"source must be a splitformer Source (a config with kind and field), a "
                    f"dict or None, got {type(source).__name__}")


class _SourceAttribute:
    """``model.source``: every assignment goes through ``keep_source``, so every model reads
    one ``Source`` (an empty ``RecordSource`` until one is set)."""

    def __get__(self, model: Any, owner: type | None = None) -> Any:
        if model is None:
            return self
        source = model.__dict__.get("source")
        if not isinstance(source, Source):  # unset, or pickled before this attribute existed
            source = model.__dict__["source"] = keep_source(source)
        return source

    def __set__(self, model: Any, source: Any) -> None:
        model.__dict__["source"] = keep_source(source)


def skeleton_of(model: Any) -> EvolutionModel | None:
    """The ``EvolutionModel`` a module is, or wraps through ``torch.compile`` (its
    ``_orig_mod``: the compiled wrapper forwards every attribute to it); None otherwise."""
    inner = getattr(model, "_orig_mod", model)  # torch's OptimizedModule: a foreign object
    return inner if isinstance(inner, EvolutionModel) else None


def shared_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with new module objects (own train/eval flags, own kernels) that
    shares every parameter and buffer with the original."""
    memo: dict[int, Any] = {id(t): t for t in module.parameters()}
    memo.update({id(b): b for b in module.buffers()})
    return copy.deepcopy(module, memo)


class EvolutionModel(nn.Module):
    """Base of every splitformer model: ``initial_condition`` -> ``evolution`` -> ``read_out``.

    Models with several evolutions (CvT's stages, the encoder-decoder pair) list the modules
    that own one in ``evolution_owners``; ``evolution`` is the one the read-out sees.
    """

    evolution: Evolution
    source: Source = _SourceAttribute()  # type: ignore[assignment]  # where it came from
    # the prefix nodes of the token grid (class and register tokens): never merged
    num_prefix_tokens: int = 0
    # the self-attention's support is causal (x' <= x) whatever the inputs: GPT-2 and the
    # decoder-only models (with_token_merging refuses them when called, not at the forward)
    causal_support: bool = False

    # -- what a family supplies ------------------------------------------------------------
    def initial_condition(self, *inputs: Any, **kwargs: Any) -> tuple[torch.Tensor, Context]:
        """u(0) (B, N_x, N_y) and the context of the evolution, from the model's inputs."""
        raise NotImplementedError

    def read_out(self, u: torch.Tensor, context: Context) -> Any:
        """The output from u(T)."""
        raise NotImplementedError

    # -- the spine ----------------------------------------------------------------------------
    def solve(self, *inputs: Any, **kwargs: Any) -> Any:
        """read_out(evolution(initial_condition(inputs))).

        When the initial condition asks for states along the path (``context.saveat``,
        a ``SaveAt``: e.g. ``output_hidden_states``), the evolution keeps them and the read-out
        finds the ``Trajectory`` in ``context.trajectory``.
        """
        return self._solve(inputs, kwargs, None)[0]

    def solve_along(self, *inputs: Any, saveat: SaveAt, **kwargs: Any
                    ) -> tuple[Any, Trajectory]:
        """(read-out, path): ``solve`` in one run of the evolution that also keeps what
        ``saveat`` asks for (besides what the read-out asks for). The path is u before the
        read-out (batch first), as in ``trajectory``; the inputs are those of ``forward``."""
        if not isinstance(saveat, SaveAt):
            raise TypeError(f"solve_along(saveat): saveat must be a SaveAt, got "
                            f"{type(saveat).__name__}")
        return self._solve(inputs, kwargs, saveat)

    def _solve(self, inputs: tuple, kwargs: dict, saveat: SaveAt | None
               ) -> tuple[Any, Trajectory | None]:
        """The spine: one run of the evolution keeping what the read-out asks for
        (``context.saveat``) and what ``saveat`` asks for; each gets its part."""
        out, path, _ = self._solve_in(inputs, kwargs, saveat)
        return out, path

    def _solve_in(self, inputs: tuple, kwargs: dict, saveat: SaveAt | None
                  ) -> tuple[Any, Trajectory | None, Context]:
        """``_solve``, with the context of the run (where its MergeTrace is). A KV tape in the
        context (``Context.tape``) is committed when the run ends and left as it was when it
        fails."""
        u0, ctx = self.initial_condition(*inputs, **kwargs)
        if ctx.tape is None:
            return self._run_in(u0, ctx, saveat)
        try:
            out = self._run_in(u0, ctx, saveat)
        except BaseException:
            ctx.tape.abort()
            raise
        ctx.tape.commit()
        return out

    def _run_in(self, u0: torch.Tensor, ctx: Context, saveat: SaveAt | None
                ) -> tuple[Any, Trajectory | None, Context]:
        asked = ctx.saveat
        if asked is None and saveat is None:
            u = self.evolution(u0, ctx)
            return self.read_out(self._unmerged(u, ctx), ctx), None, ctx
        both = saveat if asked is None else asked if saveat is None else asked.union(saveat)
        traj = self._unmerged(self.evolution(u0, ctx, both), ctx)
        grid = self.evolution.grid
        if asked is not None:
            ctx.trajectory = traj if both is asked else asked.select(traj, both, grid)
        path = None if saveat is None else traj if both is saveat else \
            saveat.select(traj, both, grid)
        return self.read_out(traj.final, ctx), path, ctx

    def _unmerged(self, run: Any, ctx: Context) -> Any:
        """u(T) (or a Trajectory) read back on the input grid when the run merged tokens and
        the merging unmerges (each kept state by the merges before its time), with the input
        grid put back into the context; as it is otherwise."""
        trace = trace_of(ctx)
        if trace is None or not trace.merging.unmerge:
            return run
        trace.restore(ctx)
        if isinstance(run, torch.Tensor):
            return trace.unmerge(run)
        tau = self.evolution.tau
        states = tuple(trace.unmerge(s, round(float(t) / tau))
                       for t, s in zip(run.times, run.state_list, strict=True))
        return Trajectory(run.times, states, trace.unmerge(run.final), substeps=run.substeps)

    def solve_traced(self, *inputs: Any, **kwargs: Any) -> tuple[Any, MergeTrace | None]:
        """(read-out, trace): ``solve`` and the ``MergeTrace`` of its run (None without token
        merging): ``trace.index[k]`` (B, N_input) says which node every input node lies in
        after the k-th merge (in step ``trace.steps[k]``), ``trace.mass`` the sum of the
        input weights in each final node; the inputs are those of ``forward``."""
        out, _, ctx = self._solve_in(inputs, kwargs, None)
        return out, trace_of(ctx)

    def merge_trace(self, *inputs: Any, **kwargs: Any) -> MergeTrace | None:
        """The ``MergeTrace`` of a forward pass on ``inputs`` (``solve_traced``)."""
        return self.solve_traced(*inputs, **kwargs)[1]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.solve(*inputs, **kwargs)

    def trajectory(self, *inputs: Any, saveat: SaveAt | None = None, **kwargs: Any
                   ) -> Trajectory:
        """u along the path, before the read-out (batch first). ``saveat`` says what to keep
        (default ``SaveAt(steps=True)``: u(t_i) at every grid point); the inputs are those of
        ``forward``."""
        u0, ctx = self.initial_condition(*inputs, **kwargs)
        ctx.saveat = None
        try:
            path = self._unmerged(
                self.evolution(u0, ctx, saveat if saveat is not None else SaveAt(steps=True)),
                ctx)
        except BaseException:
            if ctx.tape is not None:
                ctx.tape.abort()
            raise
        if ctx.tape is not None:
            ctx.tape.commit()
        return path

    # -- copies sharing parameters -------------------------------------------------------------
    def evolution_owners(self) -> list[EvolutionModel]:
        """The modules whose ``evolution`` attribute the copies below replace."""
        return [self]

    def _map_evolutions(self, fn: Callable[[Evolution, int], Evolution]):
        """A shared copy whose i-th evolution (``evolution_owners()[i]``) is fn(evolution, i)."""
        new = shared_copy(self)
        for i, owner in enumerate(new.evolution_owners()):
            owner.evolution = fn(owner.evolution, i)
        return new

    def with_scheme(self, scheme: str | Scheme, **options):
        """The same model (shared parameters) under another splitting scheme; a name is built
        on the network's layout (see ``Evolution.with_scheme``), options: integrator, form."""
        return self._map_evolutions(lambda e, i: e.with_scheme(scheme, **options))

    def refine(self, k: int):
        """The same model (shared parameters) with tau -> tau / k and N_t -> k N_t."""
        return self._map_evolutions(lambda e, i: e.refine(k))

    def coarsen(self, k: int):
        """The same model (shared parameters) with tau -> k tau and N_t -> N_t / k: the
        inverse of ``refine(k)``; each coarse step reads the controls at its midpoint
        (``Evolution.coarsen``; docs/depth.md)."""
        return self._map_evolutions(lambda e, i: e.coarsen(k))

    def drop_steps(self, indices):
        """The same model (shared parameters) without the steps ``indices`` (ShortGPT's layer
        removal; ``Evolution.drop_steps``). Models with several evolutions are refused."""
        self._one_evolution("drop_steps", "drop")
        return self._map_evolutions(lambda e, i: e.drop_steps(indices))

    def parallel_steps(self, groups):
        """The same model (shared parameters) with each group of consecutive steps run as one
        step of superposed fields ("Transformer layers as painters"' parallel layers;
        ``Evolution.parallel_steps``), e.g. ``parallel_steps([(1, 2, 3, 4)])`` of a 6-step
        network is a 3-step one. Models with several evolutions are refused."""
        self._one_evolution("parallel_steps", "superpose")
        return self._map_evolutions(lambda e, i: e.parallel_steps(groups))

    def _one_evolution(self, what: str, verb: str) -> None:
        """ValueError naming ``what`` unless this model runs one evolution of its own (step
        indices name the steps of one evolution)."""
        owners = self.evolution_owners()
        if len(owners) != 1 or owners[0] is not self:
            raise ValueError(f"{what}: {type(self).__name__} runs {len(owners)} evolutions "
                             "(stages, or an encoder and a decoder); say which evolution's "
                             f"steps to {verb} by calling it on that evolution")

    def as_network(self):
        """The same function as an ordinary network: every evolution at tau = 1 with one
        control set per step, theta at each step's midpoint with the fields' outputs scaled
        by tau (``Evolution.as_network``; new control parameters, the rest shared). What
        ``to_hf`` / ``to_torch`` / ``to_timm`` export from a coarsened or smooth-in-t model;
        the model itself when every evolution is a network already."""
        if all(o.evolution.is_network for o in self.evolution_owners()):
            return self
        return self._map_evolutions(lambda e, i: e.as_network())

    def with_controls_in_time(self, interpolation: str):
        """"constant" (the network) or "linear" (smooth in t) controls, shared parameters."""
        return self._map_evolutions(lambda e, i: e.with_controls_in_time(interpolation))

    def with_adjoint(self, adjoint):
        """The same model (shared parameters) whose gradients are computed by ``adjoint``
        ("backprop", "checkpoint", "reversible" or a value of ``time.adjoints``)."""
        return self._map_evolutions(lambda e, i: e.with_adjoint(adjoint))

    def with_patch_size(self, patch_size: Any, **options: Any):
        """The same model on another patch grid (ViT families; docs/space.md, "Refinement in
        x"). A family without a patch grid refuses, naming itself."""
        raise ValueError(self._no_patch_grid("with_patch_size"))

    def with_image_size(self, image_size: Any, **options: Any):
        """The same model on images of another size (ViT families); refused elsewhere."""
        raise ValueError(self._no_patch_grid("with_image_size"))

    def refuse_merging_export(self, what: str) -> None:
        """ValueError when an evolution of this model merges tokens: ``what`` (an export to
        torch.nn, transformers or timm) would write a network without the merge."""
        if any(o.evolution.merging is not None for o in self.evolution_owners()):
            raise ValueError(f"{what}: the model merges tokens (with_token_merging), which the "
                             "exported network cannot do; export the model it was derived "
                             "from (with_token_merging(None))")

    def _no_patch_grid(self, what: str) -> str:
        return (f"{what}: {type(self).__name__} has no patch grid to resample (only the ViT "
                "families' patch kernel and position table are read as functions on the image "
                "domain; CvT's convolutional token embedding and Q/K/V have fixed strides)")

    def with_token_merging(self, r, *, metric: str = "keys", where: str = "attention",
                           proportional: bool = True, protect: int | None = None,
                           unmerge: bool = True):
        """The same model (shared parameters) coarsening its token grid along the evolution:
        ToMe's bipartite soft matching, r nodes merged per unit of time (an int, or one per
        layer), size-weighted means, the weights of merged nodes added (``proportional``;
        False: ToMe's ablation, weight 1 per node). ``metric``: "keys" (the attention's keys
        averaged over heads), "state" or "keys+state" (both: (2 cos k + cos u) / 3);
        ``where``: "attention" (after the attention substep, ToMe) or "step" (at the start
        of each step); ``protect``: prefix nodes never merged
        (default ``num_prefix_tokens``: class and register tokens); padding never merges.
        ``unmerge``: the read-out sees u(T) on the input grid (default) or the merged grid.
        r = 0 is the model itself; ``r=None`` removes merging. See ``operators.merging``.
        Refused by name: models with several evolutions (CvT, encoder-decoder), a causal
        model (``causal_support``: GPT-2, the decoder-only models) and a kernel with a causal
        support of its own, operators that need the regular grid
        (``Operator.needs_regular_grid``), the checkpoint and reversible adjoints, the
        reversible scheme; when the model runs, a causal support asked for by the inputs
        (``is_causal``, ``tgt_is_causal``) and masks that are not key padding."""
        owners = self.evolution_owners()
        if len(owners) != 1 or owners[0] is not self:
            raise ValueError(f"with_token_merging: {type(self).__name__} runs "
                             f"{len(owners)} evolutions (stages, or an encoder and a decoder); "
                             "token merging coarsens the grid of one evolution; refused")
        value = None if r is None else TokenMerging(
            r, metric=metric, where=where, proportional=proportional, unmerge=unmerge,
            protect=self.num_prefix_tokens if protect is None else protect)
        if value is not None and value.active and self.causal_support:
            raise ValueError(f"with_token_merging: {type(self).__name__} has a causal support "
                             "(x' <= x: each token attends to the tokens before it, as in "
                             "GPT-2 and every decoder-only model): a merged node would carry a "
                             "later token's state into an earlier one; refused")
        return self._map_evolutions(lambda e, i: e.with_token_merging(value))

    def with_kernel(self, kernel, **kwargs):
        """The same model (shared parameters) with ``kernel`` in every attention operator
        (``models.kernels.set_kernel``: a name or a Kernel; refused by name where a family
        or kernel cannot take it)."""
        return set_kernel(shared_copy(self), kernel, **kwargs)

    def validating(self, on: bool = True):
        """Opt-in validation mode (in place): raise at the first substep that produces a NaN
        or an inf."""
        if not isinstance(on, bool):
            raise TypeError(f"validating(on) takes a bool, got {on!r}")
        for owner in self.evolution_owners():
            owner.evolution.validate = on
        return self


class TorchLayoutReadOut:
    """The read-out of the torch.nn families (encoder, decoder): the final norm (identity when
    ``final_norm`` is None), then the output in the layout the input came in (``batch_first``;
    ``context.readout["unbatched"]``, set by ``initial_condition``)."""

    final_norm: nn.Module | None
    batch_first: bool

    def read_out(self, u: torch.Tensor, context: Context) -> torch.Tensor:
        if self.final_norm is not None:
            u = self.final_norm(u)
        if context.readout.get("unbatched"):
            return u.squeeze(0)
        return u if self.batch_first else u.transpose(0, 1)


def path_states(context: Context) -> tuple[torch.Tensor, ...] | None:
    """The states the evolution kept for the read-out (``solve`` with a ``saveat``), or None."""
    traj = context.trajectory
    return traj.state_list if traj is not None else None


def keep_steps(context: Context, on: bool) -> Context:
    """Ask ``solve`` to keep u(t_i) at every grid point (hidden states) when ``on``."""
    if on:
        context.saveat = SaveAt(steps=True)
    return context

