"""Registry-driven tests: every family x every named scheme, integrator and substep form, and
every kernel, through the same skeleton (docs/architecture.md). A new family goes into
FAMILIES (a model family registered in splitformer.interop.families without a builder here
gets one from its record's example), a new scheme into time.schemes.SCHEMES, a new kernel into
operators.kernels.KERNELS: these tests pick them up without being edited."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import splitformer
from splitformer.interop.families import families
from splitformer.models import EvolutionModel, build_vit, causal_decoder, encoder_decoder
from splitformer.models.bert import bert_model
from splitformer.models.cvt import CvtStageSpec, build_cvt
from splitformer.operators import AttentionOperator
from splitformer.operators.kernels import KERNEL_NAMES
from splitformer.time import FORMS, INTEGRATORS, scheme_names

D = torch.float64


def _encoder(norm_first: bool):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, dtype=D,
                                       norm_first=norm_first)
    m = splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    return m, (torch.randn(2, 5, 16, dtype=D),)


def _bert():
    torch.manual_seed(0)
    m = bert_model(vocab_size=31, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=24, max_position_embeddings=12, dtype=D)
    return m, (torch.randint(0, 31, (2, 6)),)


def _vit(read_out="hf"):
    torch.manual_seed(0)
    m = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=2, num_heads=2,
                  hidden_dim=24, num_classes=3, read_out=read_out, dtype=D)
    return m, (torch.randn(2, 3, 8, 8, dtype=D),)


def _cvt():
    torch.manual_seed(0)
    specs = [CvtStageSpec(3, 8, 1, 1, patch_size=3, patch_stride=2),
             CvtStageSpec(8, 16, 2, 2, cls_token=True)]
    return build_cvt(specs, num_labels=3, dtype=D), (torch.randn(2, 3, 16, 16, dtype=D),)


def _gpt2():
    torch.manual_seed(0)
    m = causal_decoder(31, 12, 16, 2, 2, lm_head=True, dtype=D)
    return m, (torch.randint(0, 31, (2, 6)),)


def _pair():
    torch.manual_seed(0)
    m = encoder_decoder(16, 2, 2, 2, 24, dtype=D)
    return m, (torch.randn(2, 5, 16, dtype=D), torch.randn(2, 4, 16, dtype=D))


FAMILIES = {
    "encoder_post_ln": lambda: _encoder(False),
    "encoder_pre_ln": lambda: _encoder(True),
    "bert": _bert,
    "vit": _vit,
    "timm_vit": lambda: _vit("timm"),
    "cvt": _cvt,
    "gpt2": _gpt2,
    "transformer": _pair,
}


def _record_builder(record):
    """A model family only its record names (``interop.families``): the transformers model of
    its example config read by ``from_hf`` (needs transformers), and the record's inputs."""

    def build():
        model = splitformer.from_hf(record.reference(dtype=D))
        return model, tuple(record.example_inputs().values())

    return build


# every model family of the registry has a builder: its own above, else its record's
FAMILIES.update({f.name: _record_builder(f) for f in families("transformers")
                 if f.name not in FAMILIES})


def _tensor(out) -> torch.Tensor:
    """The main tensor of any family's output."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        t = getattr(out, name, None)
        if t is not None:
            return t
    raise AssertionError(f"no tensor in {type(out).__name__}")


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return _tensor(model.eval()(*inputs))


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    model, inputs = FAMILIES[request.param]()
    return request.param, model.eval(), inputs


def test_every_family_is_an_evolution_model(family):
    name, model, inputs = family
    assert isinstance(model, EvolutionModel)
    y = _run(model, inputs)
    assert torch.isfinite(y).all()
    assert torch.equal(_run(model.refine(1), inputs), y)  # refine(1) is the identity
    traj = model.trajectory(*inputs)
    assert len(traj) == model.evolution.num_steps + 1 and torch.equal(traj.states[-1], traj.final)


OPTIONS = [(s, i, f) for s in scheme_names() if s != "paper" for i in INTEGRATORS for f in FORMS]
# projections inside the fields (the Llama family's records too)
PRE_NORM = {"encoder_pre_ln", "vit", "timm_vit", "cvt", "gpt2",
            *(f.name for f in families("transformers") if f.map == "hf_llama")}


def _refused(name: str, scheme: str, form: str) -> str | None:
    """What must refuse, and a word its message must hold: on a pre-norm layout there is no
    projection substep to take the tangent of, and unsplit needs fields without pre/post."""
    if name in PRE_NORM and scheme == "unsplit":
        return "unsplit needs fields without pre/post"
    if name in PRE_NORM and form == "tangent" and scheme != "prenorm":
        return "form='tangent' needs a projection"
    if scheme == "prenorm" and form == "tangent":
        return "prenorm has no projection substeps"
    return None


def test_every_named_scheme_builds_and_runs_or_refuses(family):
    """scheme x integrator x form on every family: a finite output, refine(1) the identity,
    and the round trip back to the network's scheme; exactly the documented refusals."""
    name, model, inputs = family
    y = _run(model, inputs)
    network = model.evolution.scheme
    for scheme, integrator, form in OPTIONS:
        expected = _refused(name, scheme, form)
        if expected is not None:
            with pytest.raises(ValueError, match=expected):
                model.with_scheme(scheme, integrator=integrator, form=form)
            continue
        other = model.with_scheme(scheme, integrator=integrator, form=form)
        out = _run(other, inputs)
        assert torch.isfinite(out).all(), (name, scheme, integrator, form)
        assert torch.equal(_run(other.refine(1), inputs), out)
        if name not in ("cvt", "transformer"):  # several evolutions: one scheme value each
            assert torch.equal(_run(other.with_scheme(network), inputs), y)
    with pytest.raises(ValueError, match="needs operators"):  # the paper's own controls
        model.with_scheme("paper")


def test_lie_is_rebuilt_on_the_networks_layout():
    """with_scheme("lie") after any other scheme gives the network's Lie scheme back."""
    model, (x,) = _encoder(False)
    y = _run(model, (x,))
    for detour in ("prenorm", "norm2>ffn norm1>attention", "strang"):
        assert torch.equal(_run(model.with_scheme(detour).with_scheme("lie"), (x,)), y), detour


@pytest.mark.parametrize("kernel", sorted(KERNEL_NAMES))
def test_every_kernel_changes_every_family_or_is_refused(family, kernel):
    name, model, inputs = family
    y = _run(model, inputs)
    try:
        other = model.with_kernel(kernel)
        out = _run(other, inputs)
    except ValueError as e:  # refused: the message names the family (model class) and kernel
        assert kernel in str(e) and type(model).__name__ in str(e), str(e)
        return
    assert torch.isfinite(out).all(), (name, kernel)
    native = {m.kernel.name for m in model.modules() if isinstance(m, AttentionOperator)}
    if native == {kernel}:  # the family's own kernel (softmax; Gemma2: softcap)
        assert torch.equal(out, y)
    else:
        assert (out - y).abs().max() > 1e-8, (name, kernel)
    assert torch.equal(_run(model, inputs), y)  # the original keeps its kernel


def test_copies_keep_their_own_train_eval_state(family):
    """Copies share parameters, not modules: .train() on a copy leaves the original in eval."""
    name, model, inputs = family
    model.eval()
    for copy_ in (model.refine(2), model.with_scheme("strang"), model.with_controls_in_time(
            "linear"), model.with_kernel("softmax"), model.with_adjoint("checkpoint")):
        copy_.train()
        assert not model.training and not any(m.training for m in model.modules()), name
        assert all(p is q for p, q in zip(copy_.parameters(), model.parameters(), strict=True))


def test_every_family_pickles_deep_copies_and_saves(family, tmp_path):
    name, model, inputs = family
    y = _run(model, inputs)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert torch.equal(_run(clone, inputs), y), name
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert torch.equal(_run(torch.load(buf, weights_only=False), inputs), y), name


# -- bad scheme input: a clear error when the scheme is built, never at forward time ----------
@pytest.mark.parametrize("scheme, error, match", [
    (None, TypeError, "scheme must be a name"),
    ("attention~ffn", ValueError, "needs an operator of kind 'projection'"),
    ("attention*1e400", ValueError, "fraction must be"),
    ("parallel()", ValueError, "branch"),
    ("norm1:heun attention", ValueError, "kind 'field'"),
    ("attention:project", ValueError, "kind 'projection'"),
    ("attention ffn~relu", ValueError, "relu"),
    ("lei", ValueError, "unknown scheme"),
])
def test_bad_schemes_are_refused_when_built(scheme, error, match):
    model, _ = _encoder(False)
    with pytest.raises(error, match=match):
        model.with_scheme(scheme)


def test_scheme_names_are_stripped_and_options_checked():
    model, (x,) = _encoder(False)
    assert torch.equal(_run(model.with_scheme("strang "), (x,)),
                       _run(model.with_scheme("strang"), (x,)))
    with pytest.raises(ValueError, match="options"):
        model.with_scheme("attention norm1:project ffn norm2:project", integrator="heun")
    with pytest.raises(ValueError, match="takes the options"):
        model.with_scheme("lie", order=2)
    pair, _ = _pair()
    with pytest.raises(ValueError, match="prenorm has no projection substeps"):
        pair.with_scheme("prenorm", form="tangent")


def test_paper_model_has_no_layout_for_named_schemes():
    m = splitformer.paper_encoder(8, 2, 16, 2, dtype=D)
    with pytest.raises(ValueError, match="no field layout"):
        m.with_scheme("lie")
