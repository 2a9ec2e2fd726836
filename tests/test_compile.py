"""`torch.compile(model, fullgraph=True)` on the five schemes of the performance issue (Lie,
Strang with Euler substeps, pre-norm, Heun/RK2, parallel) for the encoder, ViT and GPT-2
families: one graph for the forward (equal to eager) and for a training step (forward and
backward traced by AOTAutograd). A graph break fails the test naming it.

The backends are the tracing ones ("eager" runs the captured graph with PyTorch's own kernels,
"aot_eager" adds the traced backward): a graph break is found while tracing, before any backend
compiles, so inductor is not needed to find one (and would cost minutes of CPU here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer
from splitformer.models import build_vit, causal_decoder

SCHEMES = [("lie", {}), ("strang", {"integrator": "euler"}), ("prenorm", {}),
           ("heun", {"integrator": "heun"}), ("parallel", {})]


def _encoder():
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    return splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)), \
        ((torch.randn(2, 8, 32),), {})


def _vit():
    return build_vit(image_size=16, patch_size=4, in_chans=3, dim=32, depth=2, num_heads=2,
                     hidden_dim=64, num_classes=5), ((torch.rand(2, 3, 16, 16),), {})


def _gpt2():
    return causal_decoder(50, 16, 32, 2, 2, ffn_dim=64, lm_head=True), \
        ((), {"input_ids": torch.randint(0, 50, (2, 16))})


FAMILIES = {"encoder": _encoder, "vit": _vit, "gpt2": _gpt2}


def _tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _scheme(model, name, options):
    if name == "heun":  # Heun/RK2 substeps on the family's own scheme
        return model.with_scheme(model.evolution.scheme.name, **options)
    return model.with_scheme(name, **options)


def _compiled(model, backend):
    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend=backend)


def _run_or_name_the_break(fn):
    try:
        return fn()
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as e:
        pytest.fail(f"graph break: {str(e).splitlines()[0]}")


@pytest.mark.parametrize("scheme, options", SCHEMES, ids=[s for s, _ in SCHEMES])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fullgraph_compile_of_every_scheme_and_family(family, scheme, options):
    torch.manual_seed(0)
    base, (args, kwargs) = FAMILIES[family]()
    model = _scheme(base, scheme, options).eval()
    with torch.no_grad():
        ref = _tensor(model(*args, **kwargs))
        out = _run_or_name_the_break(lambda: _tensor(_compiled(model, "eager")(*args, **kwargs)))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)

    model.train()
    model.zero_grad()
    (_tensor(model(*args, **kwargs)) ** 2).mean().backward()
    eager_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    step = _compiled(model, "aot_eager")
    _run_or_name_the_break(lambda: (_tensor(step(*args, **kwargs)) ** 2).mean().backward())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(eager_grads) > 0
    for g, r in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_an_out_of_range_id_is_still_refused_when_compiled():
    torch.manual_seed(0)
    model, (_, kwargs) = _gpt2()
    ids = kwargs["input_ids"].clone()
    ids[0, 0] = 50
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 50\)"):
        model(input_ids=ids)
    with pytest.raises(RuntimeError, match=r"input_ids must lie in \[0, 50\)"):
        _compiled(model.eval(), "eager")(input_ids=ids)
