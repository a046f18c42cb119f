#!/usr/bin/env bash
# Builds {{name}}.wasm from app.py: a venv with componentize-py (from PyPI, once), then
# componentize-py against Capstan's `plugin-wasi` world in wit/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
if [ ! -x .venv/bin/componentize-py ]; then
  echo "==> installing componentize-py into .venv (requirements.txt)" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
fi
echo "==> componentize-py: app.py -> {{name}}.wasm" >&2
.venv/bin/componentize-py -d wit -w plugin-wasi componentize app -o {{name}}.wasm
echo "built {{name}}.wasm; try: capstan plugins inspect {{name}}.wasm" >&2
