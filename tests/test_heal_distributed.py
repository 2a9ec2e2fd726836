"""Healing under torchrun (issue 31, deliverable 2): `heal()` on 2 CPU ranks (gloo) equals one
process on a tiny Llama converted by ``splitformer.from_hf``, after the least-squares fit of
the absorbing step (rank 0's, broadcast), on the next-token KL: the healed parameters and every
logged loss, with an even global batch (shards 2 and 2) and an odd one (shards 2 and 1). Only
rank 0 writes the healing folder. The launch is tests/test_distributed.py's: torchrun as a
subprocess (``torch.distributed.run``) on a small script, each rank dumping what it healed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch

transformers = pytest.importorskip("transformers")

import splitformer as sf  # noqa: E402
from splitformer.compression.heal import HealConfig, heal  # noqa: E402

CONFIG = {"method": "keep-first", "steps": (2,), "budget": 600.0, "max_steps": 6,
          "length": 16, "next_token": 1.0, "terminal": 0.0, "fit": "linear", "lr": 3e-3,
          "warmup": 0, "log_every": 1, "shooting": 0.3}  # w_s: token-relative beside the KL
BATCHES = {"even": 4, "odd": 3}  # shards 2 + 2 and 2 + 1

_LAUNCHED = """
import json, os, sys
import safetensors.torch, torch, transformers
import splitformer as sf
from splitformer.compression.heal import HealConfig, heal
from splitformer.training import distributed

here, config, batches = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
teacher = sf.from_hf(transformers.LlamaForCausalLM.from_pretrained(here + "/llama")).eval()
windows = torch.load(here + "/windows.pt")
with distributed.session() as ranks:
    for name, size in batches.items():
        result = heal(HealConfig(**config, batch_size=size), teacher=teacher, windows=windows,
                      out=f"{here}/heal-{name}")
        state = {k: v.detach().clone() for k, v in result.base.state_dict().items()}
        state.update({"grad." + k: p.grad for k, p in result.base.named_parameters()
                      if p.grad is not None})  # the last step's, averaged over the ranks
        safetensors.torch.save_file(state, f"{here}/{name}-rank{ranks.rank}.safetensors")
        with open(f"{here}/{name}-rank{ranks.rank}.json", "w") as f:
            json.dump({"metrics": result.metrics, "history": result.history}, f)
"""


def _tiny() -> transformers.LlamaForCausalLM:
    """test_depth_llm's tiny Llama: 4 layers, perturbed off its init."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return hf


def _losses(history: list[dict]) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["next_token"], r["shooting"]) for r in history]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The tiny Llama and windows on disk, and what 2 ranks healed from them."""
    from test_distributed import _free_port

    here = tmp_path_factory.mktemp("heal-ddp")
    _tiny().save_pretrained(here / "llama")
    windows = torch.randint(0, 96, (16, 16), generator=torch.Generator().manual_seed(3))
    torch.save(windows, here / "windows.pt")
    (here / "launch.py").write_text(textwrap.dedent(_LAUNCHED))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")  # gloo on the CPU
    config = {**CONFIG, "steps": list(CONFIG["steps"])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                        str(here / "launch.py"), str(here), json.dumps(config),
                        json.dumps(BATCHES)],
                       capture_output=True, text=True, timeout=240, env=env, cwd=here)
    assert r.returncode == 0, r.stderr[-3000:]
    teacher = sf.from_hf(transformers.LlamaForCausalLM.from_pretrained(here / "llama")).eval()
    return here, teacher, torch.load(here / "windows.pt")


@pytest.mark.parametrize("name", list(BATCHES))
def test_two_ranks_heal_as_one_process(launched, name, tmp_path):
    here, teacher, windows = launched
    torch.set_num_threads(1)
    single = heal(HealConfig(**CONFIG, batch_size=BATCHES[name]), teacher=teacher,
                  windows=windows, out=tmp_path / "single")
    assert single.metrics["steps_taken"] == 6 and single.metrics["fit"]["absorb"] == "linear"
    ref = single.base.state_dict()
    grads = {k: p.grad for k, p in single.base.named_parameters() if p.grad is not None}
    ranks = [(safetensors.torch.load_file(here / f"{name}-rank{r}.safetensors"),
              json.loads((here / f"{name}-rank{r}.json").read_text())) for r in range(2)]
    (p0, info0), (p1, info1) = ranks
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "the ranks' parameters differ"
    # the last step's gradient: the global batch's mean (AdamW alone would not see its scale)
    assert {k.removeprefix("grad.") for k in p0 if k.startswith("grad.")} == grads.keys()
    for k, g in grads.items():
        torch.testing.assert_close(p0.pop("grad." + k), g, rtol=1e-4, atol=1e-6, msg=k)
    assert p0.keys() == ref.keys()
    moved = max(float((ref[k] - teacher.state_dict()[k]).abs().max()) for k in ref)
    assert moved > 1e-3  # the fit and the 6 steps did change the parameters
    for k in ref:
        torch.testing.assert_close(p0[k], ref[k], rtol=1e-5, atol=1e-6, msg=k)
    a, b = _losses(single.history), _losses(info0["history"])
    assert [s for s, *_ in a] == [s for s, *_ in b] == list(range(1, 7))
    assert min(row[3] for row in a[1:]) > 1e-6  # the shooting term is on (step 0 has moved)
    loss = max(abs(x - y) for (_, *u), (_, *v) in zip(a, b, strict=True)
               for x, y in zip(u, v, strict=True))
    print(f"\n{name} batch, 2 ranks vs 1 process: parameters "
          f"{max(float((p0[k] - ref[k]).abs().max()) for k in ref):.1e} (moved {moved:.1e}), "
          f"logged losses {loss:.1e}")
    assert loss <= 1e-6
    assert _losses(info1["history"]) == b  # every rank logs the global batch's values
    assert info0["metrics"]["fit"] == info1["metrics"]["fit"]  # rank 0's fit, told to all
    # only rank 0 wrote the folder: its metrics.jsonl holds the logged rows once
    rows = [json.loads(line) for line in (here / f"heal-{name}/metrics.jsonl").open()]
    assert _losses(rows) == b
    assert (here / f"heal-{name}/final.json").is_file()
    assert not (here / f"heal-{name}/.lock").exists()
