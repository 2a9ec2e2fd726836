"""Measured errors of the interop maps: the tables of docs/interop.md.

Each row builds random-weight models of the reference library (seeded; every parameter
perturbed by 0.2 N(0, 1), or for CvT every weight and BatchNorm statistic drawn at random),
converts them with from_hf / from_timm, runs both on the same input and prints the max abs
difference of the outputs, in float64 (f64) and float32 (f32), for each attention path where the
library has two. The column "round trip" says whether to_x(from_x(m)).state_dict() equals
m.state_dict() (same keys, torch.equal values) for every model of the row. Nothing is
downloaded. Values above the bars (float64 1e-10, float32 1e-5) are marked "!" and make the exit
status 1, except HF ViT's eager f64 column, which measures transformers' float32 softmax (not a
bar check).

    python benchmarks/interop_errors.py [--family bert|vit|cvt|timm ...] [--threads N]

timm rows need `import timm` to work; where it fails (PyPI's torchvision beside the pinned CPU
torch) they are printed as SKIP with the reason.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable

import torch
from torch import nn

from splitformer.verification.references import maxdiff, perturb_

F64, F32 = torch.float64, torch.float32
BARS = {F64: 1e-10, F32: 1e-5}
FAMILIES = ("bert", "vit", "cvt", "timm")


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(
        sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


class Table:
    """Rows of (label, {column: error}, round trip equal) printed as a fixed-width table."""

    def __init__(self, title: str, columns: list[tuple[str, torch.dtype, bool]]):
        self.title, self.columns, self.rows = title, columns, []
        self.over_bar = False

    def add(self, label: str, errors: dict[str, float], round_trip: bool | None) -> None:
        self.rows.append((label, errors, round_trip))
        print(self._line(label, errors, round_trip), flush=True)

    def header(self) -> None:
        print(f"\n{self.title}")
        cols = "".join(f"{name:>12}" for name, _, _ in self.columns)
        line = f"{'configuration':<51}{cols}{'round trip':>11}"
        print(line)
        print("-" * len(line))

    def _line(self, label, errors, round_trip) -> str:
        cells = []
        for name, dtype, checked in self.columns:
            err = errors.get(name)
            if err is None:
                cells.append(f"{'-':>12}")
                continue
            mark = "!" if checked and not err <= BARS[dtype] else " "
            self.over_bar |= mark == "!"
            cells.append(f"{err:>11.1e}{mark}")
        rt = "-" if round_trip is None else "equal" if round_trip else "DIFFERS"
        self.over_bar |= round_trip is False
        return f"{label:<51}{''.join(cells)}{rt:>11}"


# -- BERT ---------------------------------------------------------------------------------------
BERT_BASE = {"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 24,
             "type_vocab_size": 2}
BERT_CONFIGS = {
    "hidden 32, 4 heads, 2 layers, gelu": {},
    "relu": {"hidden_act": "relu"},
    "hidden 40, 8 heads, 3 layers, intermediate 72": {
        "num_attention_heads": 8, "num_hidden_layers": 3, "hidden_size": 40,
        "intermediate_size": 72},
    "1 head, 3 token types, layer_norm_eps 1e-5": {
        "num_attention_heads": 1, "type_vocab_size": 3, "layer_norm_eps": 1e-5},
    "gelu_pytorch_tanh": {"hidden_act": "gelu_pytorch_tanh"},
    "silu, no pad_token_id, chunk_size_feed_forward 3": {
        "hidden_act": "silu", "pad_token_id": None, "chunk_size_feed_forward": 3},
}


def bert() -> list[Table]:
    import transformers

    from splitformer.interop.hf import from_hf, to_hf

    cols = [(f"{a} {d}", dt, True) for a in ("sdpa", "eager")
            for d, dt in (("f64", F64), ("f32", F32))]
    out = []
    for what, classifier in (("BertModel: max of last_hidden_state, pooler_output", False),
                             ("BertForSequenceClassification (3 labels): logits", True)):
        t = Table(what, cols)
        t.header()
        for label, overrides in BERT_CONFIGS.items():
            errors, same = {}, True
            for name, dtype, _ in cols:
                torch.manual_seed(0)
                config = transformers.BertConfig(**{**BERT_BASE, **overrides})
                config._attn_implementation = name.split()[0]
                if classifier:
                    config.num_labels = 3
                    ref = transformers.BertForSequenceClassification(config)
                else:
                    ref = transformers.BertModel(config)
                ref = perturb_(ref.to(dtype).eval(), seed=2)
                ours = from_hf(ref)
                same &= _same_state(to_hf(ours), ref)
                g = torch.Generator().manual_seed(1)
                ids = torch.randint(0, config.vocab_size, (3, 9), generator=g)
                types = torch.randint(0, config.type_vocab_size, (3, 9), generator=g)
                mask = torch.ones(3, 9, dtype=torch.long)
                mask[1, 6:] = 0
                mask[2, 2:] = 0
                x = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
                with torch.no_grad():
                    a, b = ref(**x), ours(**x)
                if classifier:
                    errors[name] = maxdiff(a.logits, b.logits)
                else:
                    errors[name] = max(maxdiff(a.last_hidden_state, b.last_hidden_state),
                                       maxdiff(a.pooler_output, b.pooler_output))
            t.add(label, errors, same)
        out.append(t)
    return out


# -- HF ViT -------------------------------------------------------------------------------------
VIT_BASE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 48, "image_size": 32, "patch_size": 8}
# label -> (overrides, class, pooler)
VIT_CONFIGS = {
    "ViTModel, gelu, pooler": ({}, "ViTModel", True),
    "ViTModel, relu, qkv_bias=False, no pooler": (
        {"hidden_act": "relu", "qkv_bias": False}, "ViTModel", False),
    "ViTModel 32x16, patch 4, gelu_pytorch_tanh, depth 3": (
        {"image_size": [32, 16], "patch_size": 4, "hidden_act": "gelu_pytorch_tanh",
         "num_attention_heads": 2, "layer_norm_eps": 1e-6, "pooler_output_size": 24,
         "num_hidden_layers": 3}, "ViTModel", True),
    "ViTModel, 1 channel, silu": ({"num_channels": 1, "hidden_act": "silu"}, "ViTModel", True),
    "ViTModel, gelu_new (tanh GELU as a formula)": (
        {"hidden_act": "gelu_new", "layer_norm_eps": 1e-6}, "ViTModel", True),
    "ViTForImageClassification (5), qkv_bias=False": (
        {"qkv_bias": False, "num_labels": 5}, "ViTForImageClassification", True),
}


def vit() -> list[Table]:
    import transformers

    from splitformer.interop.hf import from_hf, to_hf

    cols = [("sdpa f64", F64, True), ("sdpa f32", F32, True),
            ("eager f64", F64, False), ("eager f32", F32, True)]
    t = Table("HF ViT: max of last_hidden_state, pooler_output, logits", cols)
    t.header()
    for label, (overrides, cls, pooler) in VIT_CONFIGS.items():
        errors, same = {}, True
        for name, dtype, _ in cols:
            torch.manual_seed(0)
            config = transformers.ViTConfig(**{**VIT_BASE, **overrides})
            config._attn_implementation = name.split()[0]
            if cls == "ViTModel":
                ref = transformers.ViTModel(config, add_pooling_layer=pooler)
            else:
                ref = transformers.ViTForImageClassification(config)
            ref = perturb_(ref.to(dtype).eval(), seed=2)
            ours = from_hf(ref)
            same &= _same_state(to_hf(ours), ref)
            size = config.image_size
            h, w = (size, size) if isinstance(size, int) else tuple(size)
            g = torch.Generator().manual_seed(1)
            x = torch.randn(3, config.num_channels, h, w, generator=g, dtype=dtype)
            with torch.no_grad():
                a, b = ref(x), ours(x)
            errs = []
            for key in ("last_hidden_state", "pooler_output", "logits"):
                ra, rb = getattr(a, key, None), getattr(b, key, None)
                if ra is not None:
                    errs.append(maxdiff(ra, rb))
            errors[name] = max(errs)
        t.add(label, errors, same)
    return [t]


# -- CvT ----------------------------------------------------------------------------------------
CVT_TWO_STAGES = {
    "patch_sizes": [3, 3], "patch_stride": [2, 2], "patch_padding": [1, 1],
    "embed_dim": [6, 10], "num_heads": [2, 5], "depth": [2, 2], "mlp_ratio": [3.0, 1.5],
    "attention_drop_rate": [0.0] * 2, "drop_rate": [0.0] * 2, "drop_path_rate": [0.0] * 2,
    "qkv_bias": [False, False], "cls_token": [False, False],
    "qkv_projection_method": ["dw_bn"] * 2, "kernel_qkv": [5, 5], "padding_kv": [2, 2],
    "stride_kv": [1, 1], "padding_q": [2, 2], "stride_q": [1, 1],
}
CVT_ONE_STAGE = {
    "num_channels": 2, "patch_sizes": [4], "patch_stride": [4], "patch_padding": [0],
    "embed_dim": [12], "num_heads": [3], "depth": [3], "mlp_ratio": [2.0],
    "attention_drop_rate": [0.0], "drop_rate": [0.0], "drop_path_rate": [0.0],
    "qkv_bias": [True], "cls_token": [True], "qkv_projection_method": ["dw_bn"],
    "kernel_qkv": [3], "padding_kv": [1], "stride_kv": [3], "padding_q": [1], "stride_q": [1],
}


def _pixels(dtype, channels=3, shape=(2, 32, 24), seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    b, h, w = shape
    return torch.randn(b, channels, h, w, generator=g, dtype=torch.float64).to(dtype)


def _cvt_outputs(a, b) -> float:
    errs = [maxdiff(a.last_hidden_state, b.last_hidden_state)]
    if a.cls_token_value is not None:
        errs.append(maxdiff(a.cls_token_value, b.cls_token_value))
    return max(errs)


def cvt() -> list[Table]:
    import transformers

    from splitformer.interop.hf import from_hf, to_hf
    from splitformer.verification.hf_cvt import SMALL_CONFIG, randomize_

    def make(cls, dtype, seed, overrides, full=None):
        torch.manual_seed(seed)
        config = transformers.CvtConfig(**(full if full is not None
                                           else {**SMALL_CONFIG, **overrides}))
        model = randomize_(getattr(transformers, cls)(config).to(dtype), seed).eval()
        ours = from_hf(model)
        return model, ours, _same_state(to_hf(ours), model)

    def eval_model(overrides):
        def run(dtype):
            ref, ours, same = make("CvtModel", dtype, 0, overrides)
            x = _pixels(dtype, ref.config.num_channels)
            with torch.no_grad():
                return _cvt_outputs(ref(x), ours(x)), same
        return run

    def train_batchnorm(dtype):
        ref, ours, same = make("CvtForImageClassification", dtype, 3, {})
        ref.train()
        ours.train()
        errs = []
        for seed in (1, 2):
            x = _pixels(dtype, shape=(3, 32, 24), seed=seed)
            with torch.no_grad():
                errs.append(maxdiff(ref(x).logits, ours(x).logits))
        mine = to_hf(ours).state_dict()
        for k, v in ref.state_dict().items():
            if "running_" in k:
                errs.append(maxdiff(v, mine[k]))
            elif k.endswith("num_batches_tracked") and not torch.equal(v, mine[k]):
                errs.append(math.inf)
        return max(errs), same

    def drop_path(dtype):
        ref, ours, same = make("CvtModel", dtype, 5, {"drop_path_rate": [0.0, 0.2, 0.3]})
        ref.train()
        ours.train()
        x = _pixels(dtype, shape=(8, 32, 24))
        torch.manual_seed(123)
        with torch.no_grad():
            a = ref(x)
        torch.manual_seed(123)
        with torch.no_grad():
            b = ours(x)
        return _cvt_outputs(a, b), same

    def cvt13(dtype):
        ref, ours, same = make("CvtForImageClassification", dtype, 0, {},
                               full={"num_labels": 10})
        x = _pixels(dtype, shape=(1, 224, 224))
        with torch.no_grad():
            return maxdiff(ref(x).logits, ours(x).logits), same

    rows: list[tuple[str, Callable]] = [
        ("3 stages, patch 7/3/3, stride 4/2/2, cls last", eval_model({})),
        ("2 stages, no cls/qkv bias, 5x5 proj, K/V stride 1", eval_model(CVT_TWO_STAGES)),
        ("1 stage, cls token, 2 channels, K/V stride 3", eval_model(CVT_ONE_STAGE)),
        ("3 stages + classifier, train, BN batch stats", train_batchnorm),
        ("3 stages, drop_path 0/0.2/0.3, train, equal seed", drop_path),
        ("CvT-13 config + classifier, 224 x 224", cvt13),
    ]
    cols = [("float64", F64, True), ("float32", F32, True)]
    t = Table("HF CvT, images 32 x 24, K/V stride 2 unless stated: last_hidden_state + "
              "cls_token_value,\nor logits (classifier), or train-mode outputs and BatchNorm "
              "running statistics",
              cols)
    t.header()
    for label, fn in rows:
        errors, same = {}, True
        for name, dtype, _ in cols:
            errors[name], ok = fn(dtype)
            same &= ok
        t.add(label, errors, same)
    return [t]


# -- timm ---------------------------------------------------------------------------------------
TIMM_BASE = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4,
             "num_classes": 5}
TIMM_CONFIGS = {
    "class token, token pooling": {},
    "avg pooling, no class token": {"class_token": False, "global_pool": "avg"},
    "LayerScale init_values 0.1, qkv_bias=False": {"init_values": 0.1, "qkv_bias": False},
    "2 registers, no_embed_class, pre_norm, avg": {
        "reg_tokens": 2, "no_embed_class": True, "pre_norm": True, "global_pool": "avg"},
    "avg with class token, fc_norm=False": {"global_pool": "avg", "fc_norm": False},
    "num_classes=0 (pooled features)": {"num_classes": 0},
    "global_pool='' (per-token head)": {"global_pool": "", "num_classes": 3},
    "relu, proj_bias=False, mlp_ratio 2": {
        "act_layer": "relu", "proj_bias": False, "mlp_ratio": 2.0},
    "gelu_tanh, torch LayerNorm eps 1e-5": {
        "act_layer": "gelu_tanh", "norm_layer": functools.partial(nn.LayerNorm, eps=1e-5)},
    "pos_embed='none', max pooling": {"pos_embed": "none", "global_pool": "max"},
    "avgmax, pool_include_prefix, 1 register": {
        "global_pool": "avgmax", "pool_include_prefix": True, "reg_tokens": 1},
    "final_norm=False, 32x16 image, patch 4, 3 blocks": {
        "final_norm": False, "img_size": (32, 16), "patch_size": 4, "num_heads": 2,
        "depth": 3},
    "3 registers, no class token, init_values 1e-2": {
        "class_token": False, "reg_tokens": 3, "global_pool": "avg", "init_values": 1e-2},
}


def timm_rows() -> list[Table]:
    cols = [("float64", F64, True), ("float32", F32, True)]
    t = Table("timm VisionTransformer: max of model(x), forward_features(x)", cols)
    t.header()
    try:
        import timm  # noqa: F401
        from timm.models.vision_transformer import VisionTransformer
    except Exception as e:  # missing, or broken beside this torch (torchvision)
        print(f"SKIP: timm cannot be imported ({type(e).__name__}: {e})")
        return [t]
    from splitformer.interop.timm import from_timm, to_timm

    for label, overrides in TIMM_CONFIGS.items():
        errors, same = {}, True
        for name, dtype, _ in cols:
            torch.manual_seed(0)
            ref = perturb_(VisionTransformer(**{**TIMM_BASE, **overrides}).to(dtype).eval(),
                           seed=2)
            ours = from_timm(ref)
            same &= _same_state(to_timm(ours), ref)
            h, w = ref.patch_embed.img_size
            g = torch.Generator().manual_seed(1)
            x = torch.randn(3, 3, h, w, generator=g, dtype=dtype)
            with torch.no_grad():
                errors[name] = max(maxdiff(ref(x), ours(x)),
                                   maxdiff(ref.forward_features(x), ours.forward_features(x)))
        t.add(label, errors, same)
    return [t]


RUNNERS = {"bert": bert, "vit": vit, "cvt": cvt, "timm": timm_rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=FAMILIES,
                    help="only these families (repeatable); default: all")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be a positive integer")
        torch.set_num_threads(args.threads)
    import transformers

    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"threads {torch.get_num_threads()}; max abs difference, eval unless stated;\n"
          "# '!' = above the bar (f64 1e-10, f32 1e-5)")
    over = False
    for fam in args.family or FAMILIES:
        for table in RUNNERS[fam]():
            over |= table.over_bar
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
