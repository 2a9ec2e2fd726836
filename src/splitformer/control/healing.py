"""Healing a coarse network as optimal control (docs/math.md 3.13, docs/depth.md "Healing").

The fine network (the teacher, L steps) is the target; the coarse one (the student, N steps,
sharing or copying the teacher's controls) is steered towards it:

    min_theta  J = w_T |u_c(T) - u_f(T)|^2 / |u_f(T)|^2                  (terminal cost)
                 + w_k mean_x KL(p_f(x) || p_c(x))                        (next-token laws)
                 + w_s sum_i |u_c(t_i) - u_f(s_i)|^2 / |u_f(s_i)|^2       (multiple shooting)
                 or, with w_k > 0 (the next-token term: ``--heal kl``),
                   w_s sum_i mean_x |u_c(x, t_i) - u_f(x, s_i)|^2 / |u_f(x, s_i)|^2
                 + w_e mean_b (1 - cos(e_c,b, e_f,b))                     (the sentence embedding)
                 + w_r mean_{b != b'} (cos(e_c,b, e_c,b') - cos(e_f,b, e_f,b'))^2   (relations)

where |.|^2 is the mean over the tokens counted by the attention mask (and the inputs) of the
squared Euclidean norm, t_i the interior points of the coarse grid that approximate a fine grid
point s_i (``Coarsening.fine_points``; points between fine ones are skipped), and
e = sum_x m(x) u(x, T) / sum_x m(x) the masked mean of u(T) (sentence-transformers' pooling).
Beside the next-token term (w_k > 0) the shooting terms weigh each token relative to its own
norm (``token_relative_error``, as the local fit does: ``compression.fitting``): SmolLM2's
first token (the attention sink) reaches a norm 170 times the median token's
(docs/decoders-analysis.md, "Token norms"), so a ratio of sums would fit that one token's
state and no other. Without it (w_k = 0: an encoder, or ``--heal shoot`` on an LM) they stay
ratios of sums, as every run before that change computed them.
The relation term asks the pair cosines between the embeddings of a batch to be the fine
model's (what a similarity benchmark reads: the ranking of pair cosines, not each embedding).
For a causal LM the read-out that matters is the next-token distribution p(x) = softmax of the
logits at node x (docs/math.md 3.20): the KL term compares the student's with the teacher's at
every node (float32 log-softmax), and w_T (default 1) may be 0 to heal on it alone.
With w_s = w_e = 0 it is plain distillation of u(T) ("distil u(T) only"); w_s > 0 matches the
states at the coarse grid's times as well (multiple shooting: each coarse step is asked to
reproduce its stretch of the fine path, not only the end). The teacher runs in no_grad; the
student's read-out is not used (for BERT's last hidden state it is u(T) itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..time import SaveAt
from .problem import Objective

__all__ = ["Distillation", "FineSolution", "next_token_kl", "token_relative_error"]


def _relative_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    err = (a - b).pow(2).sum(-1)
    ref = b.pow(2).sum(-1)
    if mask is None:
        return err.mean() / ref.mean()
    m = mask.to(err.dtype)
    return (err * m).sum() / (ref * m).sum()


def token_relative_error(a: torch.Tensor, b: torch.Tensor,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    """mean over the tokens x (counted by ``mask``) of |a(x) - b(x)|^2 / |b(x)|^2: the squared
    error relative to each token's own norm (a trained LM's sink token grows a norm far above
    the others': a ratio of means would fit that one token)."""
    rel = (a - b).pow(2).sum(-1) / b.pow(2).sum(-1).clamp_min(1e-30)
    if mask is None:
        return rel.mean()
    m = mask.to(rel.dtype)
    return (rel * m).sum() / m.sum()


def _pooled(u: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return u.mean(1)
    m = mask.to(u.dtype).unsqueeze(-1)
    return (u * m).sum(1) / m.sum(1).clamp_min(1e-9)


def _relation(ec: torch.Tensor, ef: torch.Tensor) -> torch.Tensor:
    """mean over pairs b != b' of (cos(e_c,b, e_c,b') - cos(e_f,b, e_f,b'))^2."""
    n = ec.shape[0]
    if n < 2:
        raise ValueError(f"Distillation: the relation term needs a batch of at least two "
                         f"inputs, got {n}")
    dtype = torch.promote_types(ec.dtype, torch.float32)  # differences of cosines: >= float32
    with torch.autocast(ec.device.type, enabled=False):
        nc = torch.nn.functional.normalize(ec.to(dtype), dim=-1)
        nf = torch.nn.functional.normalize(ef.to(dtype), dim=-1)
        off = ~torch.eye(n, dtype=torch.bool, device=ec.device)
        return ((nc @ nc.T - nf @ nf.T)[off]).pow(2).mean()


@dataclass(frozen=True, eq=False)
class FineSolution:
    """The target of healing: the fine (teacher) model's path u_f, computed without gradients.
    A value held by the objective, not a submodule: the teacher's parameters are neither
    trained nor part of the objective's ``parameters()`` or ``state_dict``."""

    model: nn.Module

    @property
    def num_steps(self) -> int:
        """L, the fine grid's steps (its final point is T)."""
        return self.model.evolution.num_steps

    def path(self, inputs: Mapping[str, Any], *, every_step: bool) -> list[torch.Tensor]:
        """u_f at the fine grid points 0 .. L (``every_step``) or [u_f(T)] alone."""
        with torch.no_grad():
            if every_step:
                return self.model.trajectory(**inputs, saveat=SaveAt(steps=True)).state_list
            return [self.model.trajectory(**inputs, saveat=SaveAt()).final]

    def read_out(self, inputs: Mapping[str, Any], *, every_step: bool
                 ) -> tuple[Any, list[torch.Tensor]]:
        """(the read-out, the path of ``path``) from one run of the fine model."""
        with torch.no_grad():
            out, traj = self.model.solve_along(**inputs, saveat=SaveAt(steps=every_step))
            return out, list(traj.state_list) if every_step else [traj.final]


def next_token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
    """mean over the nodes (counted by ``mask``) of KL(p_f || p_c), p = softmax(logits),
    in float32."""
    with torch.autocast(student_logits.device.type, enabled=False):
        logq = student_logits.float().log_softmax(-1)
        logp = teacher_logits.float().log_softmax(-1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
    if mask is None:
        return kl.mean()
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum()


class Distillation(nn.Module):
    """The healing objective of a student against a teacher (module doc).

    student, teacher: splitformer models taking the same keyword inputs (``trajectory``);
    fine_points: for the student's grid points 0 .. N, the teacher's grid point each
    approximates, or None (``Coarsening.fine_points``); the last is the teacher's T.
    shooting, embedding, relation, next_token, terminal: the weights w_s, w_e, w_r, w_k, w_T
    (floats >= 0; the relation term needs batches of at least two inputs; the next-token term
    a causal LM, whose read-out has logits; with it the shooting terms are token-relative,
    ``token_relative_error``, else ratios of sums).

    forward(inputs) -> Objective with parts "terminal" and, where weighted, "shooting",
    "embedding", "relation" and "next_token"; ``inputs`` a mapping of keyword inputs, its
    "attention_mask" (if any) the tokens that count.
    """

    def __init__(self, student: nn.Module, teacher: nn.Module,
                 fine_points: Sequence[int | None], *, shooting: float = 0.0,
                 embedding: float = 0.0, relation: float = 0.0, next_token: float = 0.0,
                 terminal: float = 1.0) -> None:
        super().__init__()
        for name, w in (("shooting", shooting), ("embedding", embedding),
                        ("relation", relation), ("next_token", next_token),
                        ("terminal", terminal)):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0:
                raise ValueError(f"Distillation: {name} must be a number >= 0, got {w!r}")
        points = list(fine_points)
        if len(points) < 2 or points[0] != 0 or points[-1] is None:
            raise ValueError(f"Distillation: fine_points must start at 0 and end at the "
                             f"teacher's final grid point, got {points!r}")
        steps = student.evolution.num_steps
        if len(points) != steps + 1:
            raise ValueError(f"Distillation: fine_points has {len(points)} entries, the student "
                             f"has {steps + 1} grid points")
        target = FineSolution(teacher)
        if points[-1] != target.num_steps:
            raise ValueError(f"Distillation: fine_points ends at {points[-1]}, the teacher's "
                             f"final grid point is {target.num_steps}")
        self.student = student
        self.target = target
        self.fine_points = points
        self.shooting, self.embedding = float(shooting), float(embedding)
        self.relation = float(relation)
        self.next_token, self.terminal = float(next_token), float(terminal)

    def interior(self) -> list[tuple[int, int]]:
        """(student point, teacher point) of the shooting targets."""
        return [(i, p) for i, p in enumerate(self.fine_points[1:-1], start=1) if p is not None]

    def forward(self, inputs: Mapping[str, Any]) -> Objective:
        inputs = dict(inputs)
        mask = inputs.get("attention_mask")
        pairs = self.interior() if self.shooting else []
        if self.next_token:
            fine_out, fine = self.target.read_out(inputs, every_step=bool(pairs))
            out, traj = self.student.solve_along(**inputs, saveat=SaveAt(steps=bool(pairs)))
            coarse = list(traj.state_list) if pairs else None
            final = traj.final
        else:
            fine = self.target.path(inputs, every_step=bool(pairs))
            if pairs:
                coarse = self.student.trajectory(**inputs, saveat=SaveAt(steps=True)).state_list
                final = coarse[-1]
            else:
                final = self.student.trajectory(**inputs, saveat=SaveAt()).final
                coarse = None
        terminal = _relative_mse(final, fine[-1], mask)
        parts = {"terminal": terminal}
        total = self.terminal * terminal
        if self.next_token:
            parts["next_token"] = next_token_kl(out.logits, fine_out.logits, mask)
            total = total + self.next_token * parts["next_token"]
        if pairs:
            relative = token_relative_error if self.next_token else _relative_mse
            shoot = sum(relative(coarse[i], fine[p], mask) for i, p in pairs)
            parts["shooting"] = shoot
            total = total + self.shooting * shoot
        if self.embedding or self.relation:
            ec, ef = _pooled(final, mask), _pooled(fine[-1], mask)
        if self.embedding:
            cos = torch.nn.functional.cosine_similarity(ec, ef, dim=-1)
            parts["embedding"] = (1 - cos).mean()
            total = total + self.embedding * parts["embedding"]
        if self.relation:
            parts["relation"] = _relation(ec, ef)
            total = total + self.relation * parts["relation"]
        return Objective(total=total, terminal=terminal, parts=parts, output=final)
