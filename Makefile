# The two commands of the README: `make demo` and `make test`. Each bootstraps .venv first.
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
PY := .venv/bin/python

.PHONY: venv demo test fuzz bench load wheel lowcode-e2e
venv:
	@bash scripts/bootstrap.sh

demo: venv
	$(PY) -m gpuprompt demo

# Two workers (TEST_WORKERS=N for more): each test file runs whole on one of them, and the files that
# share a server (the vLLM pair, the Ray cluster) run together (see tests/conftest.py).
test: venv
	$(PY) -m pytest -q -rs -n $(or $(TEST_WORKERS),2) --dist loadgroup --no-loadscope-reorder

# Property tests with fresh random examples (ten times as many) instead of the derandomized default.
fuzz: venv
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -rs -m property

bench: venv
	$(PY) -m gpuprompt bench all --quick --out bench-results

# A local server + Locust headless for a bounded time; prints p50/p95 and failures per request type.
# Options: make load LOAD_USERS=32 LOAD_TIME=60s LOAD_BACKEND=auto|vllm|transformers
load: venv
	$(PY) examples/locustfile.py --users $(or $(LOAD_USERS),32) --run-time $(or $(LOAD_TIME),60s) --backend $(or $(LOAD_BACKEND),auto)

# Flowise itself against the server, on loopback: installs Flowise 3.1.4 from npm into
# ~/.cache/gpuprompt/flowise-3.1.4 the first time (~3 GB, minutes), then builds and checks four flows
# through its REST API. Not part of `make test`. See README, *Low-code builders*.
lowcode-e2e: venv
	bash scripts/lowcode_e2e.sh

# The wheel a pip user installs, built offline with the hatchling of .venv (dev group) into dist/.
wheel: venv
	$(PY) -m pip wheel . --no-deps --no-build-isolation --no-index -w dist
