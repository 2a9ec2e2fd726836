"""Compressing a trained network in depth (t) and tokens (x): coarse grids as values, healing
as optimal control (docs/math.md 3.13, docs/depth.md).

    coarsening = coarsenings.plan("drop", model, steps=3, probe=ids)   # which coarse grid
    student = coarsening.apply(model)                                  # shared parameters
    result = heal(HealConfig(...), teacher=model, student=..., out=DIR)
"""



class Diverged(FloatingPointError):
    """The healing's loss is not finite at ``step`` (``loss``): the step was too long for it,
    so the parameters were left as they were before it (``heal.heal``)."""

    def __init__(self, loss: float, step: int) -> None:
        super().__init__(f"heal: the loss is {loss} at step {step}; lower lr")
        self.loss, self.step = loss, step


from .coarsenings import METHODS, Coarsening, method_names, plan  # noqa: E402

__all__ = ["METHODS", "Coarsening", "Diverged", "method_names", "plan"]
