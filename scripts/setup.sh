#!/usr/bin/env bash
# Create (or update) the checkout's .venv with everything `make demo` and `make test` need.
# Idempotent: the Makefile reruns it only when the files it depends on change.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
say() { printf 'setup: %s\n' "$*"; }

if ! command -v npm >/dev/null 2>&1; then
  say "npm (Node.js 18+) is needed to build the JupyterLab extension from source; install nodejs and rerun" >&2
  exit 2
fi

[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install --quiet --upgrade pip

# torch: never replace one that is there (it may be a CUDA build the user chose). Without one, a
# bare `torch` requirement would pull PyPI's multi-GB CUDA build, so decide here.
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  say "keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; then
  say "NVIDIA driver found: installing PyPI's CUDA build of torch"
  pip install --quiet "torch${TORCH_VERSION:+==$TORCH_VERSION}"
else
  say "no NVIDIA driver: installing a CPU build of torch==${TORCH_VERSION:-2.13.0}"
  pip install --quiet "torch==${TORCH_VERSION:-2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi

# A previous set-up linked the venv's extension folder to jupyter_trainmate/labextension/: an
# install through that link would write the venv's install.json into the source tree (and the
# next wheel would then carry it twice). Unlink first; the link is made again below.
LINKED="$VENV/share/jupyter/labextensions/jupyter-trainmate"
[ -L "$LINKED" ] && rm "$LINKED"
rm -f jupyter_trainmate/labextension/install.json

# The editable install runs hatch-jupyter-builder, which runs `npm install` and builds the lab
# extension into jupyter_trainmate/labextension/.
say "installing jupyter_trainmate (editable) with its test and dev extras"
pip install --quiet -e ".[dev]"
# Link the built extension into the venv so a rebuild (npm run build:prod) is live at once.
"$VENV/bin/jupyter-builder" develop --overwrite . >/dev/null

# Browser tests drive Debian's chromium through Playwright (no browser download).
if [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
    say "installing Debian's chromium for the browser tests"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q chromium >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; }
  else
    say "WARNING: /usr/bin/chromium is missing and apt-get is not allowed here: browser tests will fail" >&2
  fi
fi
say "ready: $VENV"
