#!/usr/bin/env bash
# Sets everything up and runs the main job: the Ecdysis app on the embedded local model
# (no API key, no network). Arguments go to streamlit: scripts/run.sh --server.port 8600
# (make run ARGS="--server.port 8600").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamlit run app/main.py "$@"
