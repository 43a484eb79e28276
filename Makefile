# The two commands of the README: `make demo` and `make test`. Each bootstraps .venv first.
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
PY := .venv/bin/python

.PHONY: venv demo test bench load
venv:
	@bash scripts/bootstrap.sh

demo: venv
	$(PY) -m gpuprompt.cli demo

test: venv
	$(PY) -m pytest -q -rs

bench: venv
	$(PY) -m gpuprompt.cli bench all --quick --out bench-results
