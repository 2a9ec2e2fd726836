"""``splitformer.save`` / ``splitformer.load`` of models made by ``from_hf`` (every family with
a store record), changed or not by with_scheme, refine, coarsen, drop_steps, with_kernel,
with_controls_in_time and with_token_merging: the loaded model's outputs equal the saved
model's bitwise (float32 and float64), and it runs the same scheme, grid, kernels and merging.
What the record cannot hold is refused by name; a damaged file is refused naming it. Small
random configs built with transformers (nothing downloaded)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import splitformer
from splitformer.interop import families as fam
from splitformer.operators.attention import AttentionOperator
from splitformer.operators.kernels import SoftmaxKernel
from splitformer.training import checkpoints
from splitformer.training.checkpoints import CheckpointError

transformers = pytest.importorskip("transformers")

DTYPES = (torch.float32, torch.float64)


def _reference(name: str, cls: str | None = None, dtype=torch.float32, **changes):
    """The transformers model of family ``name`` from its example config with ``changes``."""
    record = fam.family(name)
    config = getattr(transformers, record.config)(**{**record.example, **changes})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, cls or record.classes[0])(config)
    return model.to(dtype).eval()


def _inputs(name: str, dtype) -> dict:
    x = fam.family(name).example_inputs(batch=2, length=8)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}


def _main(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        t = getattr(out, key, None)
        if t is not None:
            return t
    return out[0]


def _kernels(model) -> list:
    return [(path, type(op.kernel), repr(op.kernel), op.scale)
            for path, op in model.named_modules() if isinstance(op, AttentionOperator)]


def _same_model(saved, loaded, x) -> None:
    """Bitwise equal outputs, and the same scheme, grid, controls, merging and kernels."""
    assert type(loaded) is type(saved) and not loaded.training
    with torch.no_grad():
        assert torch.equal(_main(loaded(**x)), _main(saved.eval()(**x)))
    for a, b in zip(saved.evolution_owners(), loaded.evolution_owners(), strict=True):
        ea, eb = a.evolution, b.evolution
        assert str(eb.scheme) == str(ea.scheme) and eb.scheme == ea.scheme
        assert eb.stage_text() == ea.stage_text()
        assert (eb.tau, eb.num_steps, eb.grid) == (ea.tau, ea.num_steps, ea.grid)
        assert eb.controls.interpolation == ea.controls.interpolation
        assert len(eb.controls) == len(ea.controls)
        assert eb.merging == ea.merging and eb.adjoint == ea.adjoint
    assert _kernels(loaded) == _kernels(saved)
    assert loaded.source == saved.source


def _round_trip(model, folder):
    rng = torch.get_rng_state()
    splitformer.save(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["model.json", "model.safetensors"]
    loaded = splitformer.load(folder)
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn from the global RNG
    return loaded


# -- every family -------------------------------------------------------------------------------
CLASSES = [(f.name, c) for f in fam.stored() if f.library == "transformers" for c in f.classes]


def test_every_from_hf_family_has_a_store_record():
    names = {f.name for f in fam.stored()}
    assert {"bert", "vit", "cvt", "gpt2"} <= names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,cls", CLASSES)
def test_every_family_round_trips_bitwise(tmp_path, name, cls, dtype):
    model = splitformer.from_hf(_reference(name, cls, dtype)).eval()
    loaded = _round_trip(model, tmp_path / "m")
    assert next(loaded.parameters()).dtype == dtype
    _same_model(model, loaded, _inputs(name, dtype))


# -- what a user does to a model ---------------------------------------------------------------
CHANGES = {
    "strang": lambda m: m.with_scheme("strang"),
    "strang-euler": lambda m: m.with_scheme("strang", integrator="euler"),
    "parallel": lambda m: m.with_scheme("parallel"),
    "reversible": lambda m: m.with_scheme("reversible"),
    "scheme-string": lambda m: m.with_scheme("attention:heun norm1:project ffn:rk4*0.5 "
                                             "norm2:project ffn*0.5 norm2:project"),
    "refine": lambda m: m.refine(2),
    "coarsen": lambda m: m.coarsen(2),
    "refine-coarsen": lambda m: m.refine(3).coarsen(2),
    "drop_steps": lambda m: m.drop_steps([1, 2]),
    "linear-controls": lambda m: m.with_controls_in_time("linear"),
    "gaussian": lambda m: m.with_kernel("gaussian"),
    "sinkhorn": lambda m: m.with_kernel("sinkhorn", iterations=5),
    "linear-kernel": lambda m: m.with_kernel("linear"),
    "alibi": lambda m: m.with_kernel("alibi"),
    "rotary": lambda m: m.with_kernel("rotary", base=100.0),
    "kernel-instance": lambda m: m.with_kernel(SoftmaxKernel(scale=0.3)),
    "merging": lambda m: m.with_token_merging(2),
    "merging-schedule": lambda m: m.with_token_merging([1, 0, 2, 0], metric="keys+state",
                                                       where="step", proportional=False),
    "all-at-once": lambda m: (m.drop_steps([0]).with_scheme("strang").refine(2)
                              .with_controls_in_time("linear").with_kernel("gaussian")
                              .with_token_merging(1)),
    "checkpoint-adjoint": lambda m: m.with_adjoint("checkpoint").validating(),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_bert_round_trips_bitwise(tmp_path, change, dtype):
    base = splitformer.from_hf(_reference("bert", "BertForSequenceClassification", dtype,
                                          num_hidden_layers=4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a kernel instance replacing the scale
        model = CHANGES[change](base).eval()
    loaded = _round_trip(model, tmp_path / "m")
    _same_model(model, loaded, _inputs("bert", dtype))


GPT2_CHANGES = {
    "strang": lambda m: m.with_scheme("strang"),
    "refine": lambda m: m.refine(2),
    "coarsen": lambda m: m.coarsen(2),
    # GPT-2's attention scale by layer is data of each operator: a dropped first layer keeps
    # the later layers' scales
    "drop_steps": lambda m: m.drop_steps([0, 2]),
    "linear-controls": lambda m: m.with_controls_in_time("linear"),
    "alibi": lambda m: m.with_kernel("alibi", causal=True),
    "rotary": lambda m: m.with_kernel("rotary"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("change", sorted(GPT2_CHANGES))
def test_a_changed_gpt2_round_trips_and_generates_the_same(tmp_path, change, dtype):
    base = splitformer.from_hf(_reference("gpt2", "GPT2LMHeadModel", dtype, n_layer=4,
                                          scale_attn_by_inverse_layer_idx=True)).eval()
    model = GPT2_CHANGES[change](base).eval()
    loaded = _round_trip(model, tmp_path / "m")
    _same_model(model, loaded, _inputs("gpt2", dtype))
    prompt = torch.randint(0, 31, (1, 3), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded.generate(prompt, max_new_tokens=4),
                       model.generate(prompt, max_new_tokens=4))


OTHER_CHANGES = {
    ("vit", "ViTForImageClassification"): {
        "strang-refine": lambda m: m.with_scheme("strang").refine(2),
        "merging": lambda m: m.with_token_merging(2, unmerge=False),
        "refine-merging": lambda m: m.refine(2).with_token_merging(1, metric="state"),
        "drop_steps": lambda m: m.drop_steps([1]),
        "gaussian": lambda m: m.with_kernel("gaussian"),
    },
    ("cvt", "CvtForImageClassification"): {
        "strang": lambda m: m.with_scheme("strang"),
        "refine": lambda m: m.refine(2),
        "linear-controls": lambda m: m.with_controls_in_time("linear"),
        "sinkhorn": lambda m: m.with_kernel("sinkhorn"),
    },
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family,cls,change", [(f, c, ch) for (f, c), chs in OTHER_CHANGES.items()
                                               for ch in sorted(chs)])
def test_a_changed_image_model_round_trips_bitwise(tmp_path, family, cls, change, dtype):
    changes = {"num_hidden_layers": 3} if family == "vit" else {}
    base = splitformer.from_hf(_reference(family, cls, dtype, **changes)).eval()
    model = OTHER_CHANGES[(family, cls)][change](base).eval()
    loaded = _round_trip(model, tmp_path / "m")
    _same_model(model, loaded, _inputs(family, dtype))


def test_an_evolution_replaced_in_place_is_saved_as_it_is(tmp_path):
    """The record is what the model runs, however it got there."""
    model = splitformer.from_hf(_reference("bert", num_hidden_layers=4)).eval()
    model.evolution = model.evolution.with_scheme("strang").refine(3)
    model.evolution.controls[1]["attention"].set_kernel("gaussian")
    loaded = _round_trip(model, tmp_path / "m")
    _same_model(model, loaded, _inputs("bert", torch.float32))
    assert loaded.evolution.num_steps == 12


def test_a_compiled_model_and_a_second_save_over_the_first(tmp_path):
    model = splitformer.from_hf(_reference("bert")).with_scheme("strang").eval()
    splitformer.save(torch.compile(model), tmp_path / "m")
    _same_model(model, splitformer.load(tmp_path / "m"), _inputs("bert", torch.float32))
    other = model.refine(2)
    splitformer.save(other, tmp_path / "m")  # replaces the earlier save
    assert splitformer.load(tmp_path / "m").evolution.num_steps == 4


# -- the JSON ---------------------------------------------------------------------------------
def test_model_json_reads_as_the_model_prints(tmp_path):
    base = splitformer.from_hf(_reference("bert", num_hidden_layers=4))
    model = (base.drop_steps([3]).with_scheme("strang").refine(2)
             .with_controls_in_time("linear").with_token_merging(1)
             .with_kernel("sinkhorn", iterations=4))
    splitformer.save(model, tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["format"] == "splitformer.model" and doc["class"].endswith("BertEncoderModel")
    assert doc["source"]["kind"] == "hf-bert"
    assert doc["source"]["source"]["num_hidden_layers"] == 4
    (evo,) = doc["evolutions"]
    assert evo["owner"] == ""
    assert evo["scheme"] == {"named": True, "name": "strang",
                             "options": {"integrator": "heun", "form": "raw"},
                             "text": str(model.evolution.scheme)}
    assert evo["grid"] == {"T": 3.0, "num_steps": 6, "tau": 0.5}
    assert evo["controls"] == {"interpolation": "linear", "sets": 3}
    assert evo["drop_steps"] == [3]
    assert evo["merging"] == {"r": 1, "metric": "keys", "where": "attention",
                              "proportional": True, "protect": 1, "unmerge": True}
    assert evo["adjoint"] == "backprop" and evo["validate"] is False
    (kernel,) = doc["kernels"]
    assert kernel["kernel"] == "sinkhorn"
    assert kernel["options"] == {"iterations": 4, "scale": None}
    assert kernel["operators"] == [f"evolution.controls.sets.{i}.attention" for i in range(3)]
    sha = doc["files"]["model.safetensors"]["sha256"]
    import hashlib

    assert hashlib.sha256((tmp_path / "m" / "model.safetensors").read_bytes()).hexdigest() == sha


def test_a_scheme_string_is_recorded_as_text(tmp_path):
    model = splitformer.from_hf(_reference("bert")).with_scheme(
        "attention:rk4 norm1:project ffn:heun norm2:project")
    splitformer.save(model, tmp_path / "m")
    (evo,) = json.loads((tmp_path / "m" / "model.json").read_text())["evolutions"]
    assert evo["scheme"]["named"] is False
    assert evo["scheme"]["text"] == "attention:rk4 norm1:project ffn:heun norm2:project"
    assert str(splitformer.load(tmp_path / "m").evolution.scheme) == evo["scheme"]["text"]


# -- refusals ---------------------------------------------------------------------------------
class UserKernel(SoftmaxKernel):
    """A kernel written by a user (here: softmax under another class)."""


class UserFFN(torch.nn.Module):
    pass


def _refused(model, folder, pattern):
    with pytest.raises(ValueError, match=pattern):
        splitformer.save(model, folder)
    assert not folder.exists()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}")]


def test_what_the_record_cannot_hold_is_refused_by_name(tmp_path):
    base = splitformer.from_hf(_reference("bert", num_hidden_layers=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = base.with_kernel(UserKernel())
    _refused(mine, tmp_path / "a", r"splitformer.save: this BertEncoderModel cannot be saved: "
                                   r"the kernel of 'evolution.controls.sets.0.attention' is a "
                                   r"UserKernel.*user-written kernel")
    _refused(base.parallel_steps([(1, 2)]), tmp_path / "b",
             r"superposes steps \[1\] \(parallel_steps\)")
    edited = base.with_scheme("lie")
    edited.evolution.controls[2]["norm2"].eps = 1e-5
    _refused(edited, tmp_path / "c", r"'evolution.controls.sets.2.norm2.eps' is 1e-05, the "
                                     r"record rebuilds 1e-12")
    replaced = base.with_scheme("lie")
    ffn = replaced.evolution.controls[0]["ffn"]
    user = type("UserFeedForward", (type(ffn),), {})
    ffn.__class__ = user
    _refused(replaced, tmp_path / "d", r"'evolution.controls.sets.0.ffn' is a UserFeedForward, "
                                       r"the record rebuilds a FeedForward")
    _refused(base.refine(2).as_network(), tmp_path / "e", r"holds 8 control sets, more than "
                                                          r"the 4")


def test_models_from_elsewhere_are_refused_naming_from_hf(tmp_path):
    with pytest.raises(ValueError, match=r"models made by splitformer.from_hf \(BERT, ViT, CvT, "
                                         r"GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma2 or "
                                         r"Gemma3\); this Encoder cannot be saved"):
        splitformer.save(splitformer.network_encoder(8, 2, 16, 1), tmp_path / "a")


# -- damaged files ----------------------------------------------------------------------------
def test_a_damaged_file_is_refused_naming_it(tmp_path):
    model = splitformer.from_hf(_reference("bert")).with_scheme("strang")
    splitformer.save(model, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100:] = bytes(100)  # 100 zeroed bytes: the file keeps its size
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: content does not match the "
                                              r"sha256 in model\.json"):
        splitformer.load(tmp_path / "m")
    splitformer.save(model, tmp_path / "n")
    meta = tmp_path / "n" / "model.json"
    meta.write_text(meta.read_text().replace('"strang"', '"lie"'))
    with pytest.raises(CheckpointError, match=r"model\.json: content does not match its sha256"):
        splitformer.load(tmp_path / "n")


def test_a_killed_save_leaves_no_half_written_folder(tmp_path, monkeypatch):
    model = splitformer.from_hf(_reference("bert")).with_token_merging(1)
    splitformer.save(model, tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    calls = []

    def interrupted(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, data)

    real = checkpoints.write_synced
    monkeypatch.setattr(checkpoints, "write_synced", interrupted)
    with pytest.raises(KeyboardInterrupt):
        splitformer.save(model.refine(2), tmp_path / "m")
    with pytest.raises(KeyboardInterrupt):
        calls.clear()
        splitformer.save(model, tmp_path / "new")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no "new", no temporary folder
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before


# -- to_hf says where such a model goes -------------------------------------------------------
def test_to_hf_refusals_name_splitformer_save(tmp_path):
    base = splitformer.from_hf(_reference("bert"))
    for model in (base.with_scheme("strang"), base.with_token_merging(1)):
        with pytest.raises(ValueError, match=r"splitformer.save\(model, DIR\) saves such a "
                                             r"model as it is"):
            splitformer.to_hf(model)
        splitformer.save(model, tmp_path / "m")  # and it does


# -- MODEL for analyze, theory, generate ----------------------------------------------------
def test_a_saved_folder_is_a_model_the_commands_take(tmp_path):
    from splitformer.subjects.resolve import load_subject
    from splitformer.subjects.subject import InputError

    vit = splitformer.from_hf(_reference("vit", "ViTForImageClassification"))
    splitformer.save(vit.with_token_merging(1), tmp_path / "vit")
    sub = load_subject(str(tmp_path / "vit"))
    assert sub.takes == "image" and sub.image is not None
    assert sub.model.evolution.merging is not None
    splitformer.save(splitformer.from_hf(_reference("bert")).refine(2), tmp_path / "bert")
    sub = load_subject(str(tmp_path / "bert"))
    assert sub.takes == "text" and sub.model.evolution.num_steps == 4
    with pytest.raises(InputError, match="holds no tokenizer"):  # save keeps none
        sub.encode(["a text"], "--text")


def test_a_gpt2_with_transformers_default_dropout_saves_and_loads(tmp_path):
    """GPT2Config's default dropout rates (0.1; real checkpoints have them too) are recorded:
    save refused every such model ('attn_dropout is 0.1, the record rebuilds 0.0')."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=61,
                                    n_positions=32)).eval()
    model = splitformer.from_hf(hf).eval().with_scheme("strang")
    splitformer.save(model, tmp_path / "m")
    back = splitformer.load(tmp_path / "m").eval()
    ids = torch.randint(0, 61, (2, 5))
    assert torch.equal(model.generate(ids, 6), back.generate(ids, 6))
    assert back.evolution.controls.sets[0].attention.attn_dropout == 0.1
