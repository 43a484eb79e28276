#!/usr/bin/env bash
# `make lowcode-e2e`: Flowise itself against `gpuprompt serve`, end to end, on loopback.
#
# 1. Installs Flowise (FLOWISE_VERSION, default 3.1.4) from npm into a cache folder outside the
#    repository (GPUPROMPT_FLOWISE_DIR, default ~/.cache/gpuprompt/flowise-<version>), once, with
#    the recipe that works offline: `npm install --ignore-scripts` (faiss-node's and puppeteer's
#    install scripts download binaries from outside the npm registry), then sqlite3 built from
#    source with node-gyp against the installed node's own headers (`--nodedir`: without it
#    node-gyp downloads them). About 3 GB and several minutes the first time; a no-op afterwards.
# 2. Runs scripts/lowcode_e2e.py: starts the server and Flowise, builds four flows through Flowise's
#    REST API (chat, RAG with a follow-up, streaming, Tool Agent) and checks each answer.
#
# Not part of `make test`. Options: --install-only; anything else is passed to the driver.
set -euo pipefail
cd "$(dirname "$0")/.."

FLOWISE_VERSION="${FLOWISE_VERSION:-3.1.4}"
FLOWISE_DIR="${GPUPROMPT_FLOWISE_DIR:-$HOME/.cache/gpuprompt/flowise-$FLOWISE_VERSION}"

for tool in node npm make g++; do
  command -v "$tool" >/dev/null || { echo "lowcode-e2e: '$tool' is not on PATH; Flowise needs node + npm, and sqlite3 builds with make and g++" >&2; exit 2; }
done
NODEDIR=$(node -p "require('path').resolve(process.execPath, '..', '..')")
if [ ! -f "$NODEDIR/include/node/node.h" ]; then
  echo "lowcode-e2e: node's headers are not at $NODEDIR/include/node (install the distribution's nodejs dev headers, e.g. libnode-dev); node-gyp would download them otherwise" >&2
  exit 2
fi

STAMP="$FLOWISE_DIR/.gpuprompt-installed"
WANT="flowise@$FLOWISE_VERSION node-$(node --version)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$FLOWISE_DIR/node_modules/flowise/bin/run" ]; then
  echo "lowcode-e2e: Flowise $FLOWISE_VERSION already installed in $FLOWISE_DIR"
else
  echo "lowcode-e2e: installing Flowise $FLOWISE_VERSION into $FLOWISE_DIR (~3 GB, several minutes)"
  mkdir -p "$FLOWISE_DIR"
  rm -f "$STAMP"
  echo '{"private": true}' > "$FLOWISE_DIR/package.json"
  start=$SECONDS
  (cd "$FLOWISE_DIR" && PUPPETEER_SKIP_DOWNLOAD=true npm install "flowise@$FLOWISE_VERSION" \
      --ignore-scripts --no-audit --no-fund --loglevel=error)
  echo "lowcode-e2e: npm install took $((SECONDS - start)) s; building sqlite3 from source against $NODEDIR/include/node"
  start=$SECONDS
  if ! (cd "$FLOWISE_DIR/node_modules/sqlite3" && ../.bin/node-gyp rebuild --release --nodedir="$NODEDIR") \
      > "$FLOWISE_DIR/sqlite3-build.log" 2>&1; then
    tail -40 "$FLOWISE_DIR/sqlite3-build.log" >&2
    echo "lowcode-e2e: building sqlite3 failed (log: $FLOWISE_DIR/sqlite3-build.log)" >&2
    exit 1
  fi
  echo "lowcode-e2e: sqlite3 built in $((SECONDS - start)) s"
  (cd "$FLOWISE_DIR" && node -e "require('sqlite3')") || { echo "lowcode-e2e: sqlite3 does not load after the build" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi

if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
exec .venv/bin/python scripts/lowcode_e2e.py --flowise-dir "$FLOWISE_DIR" "$@"
