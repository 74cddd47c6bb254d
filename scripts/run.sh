#!/usr/bin/env bash
# Sets everything up and runs the main job: the Ecdysis app on the embedded local model
# (no API key, no network). Until the app lands it runs a headless batch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -f app/main.py ]; then
  exec .venv/bin/streamlit run app/main.py "$@"
fi
exec .venv/bin/ecdysis run --suite reasoning-mix --model smollm2 --limit 30 "$@"
