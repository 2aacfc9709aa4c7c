#!/usr/bin/env bash
# What the server's tests need beyond Rust, installed on a fresh machine (idempotent):
# a Python virtual environment at .venv with the `openai` client and selenium
# (tests/server/requirements.txt, pinned), and Debian's Chromium and ChromeDriver for the chat
# page's browser test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/server/requirements.txt

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
echo "test-deps: $(.venv/bin/python -c 'import openai, selenium; print("openai", openai.__version__, "selenium", selenium.__version__)'), $(chromium --version)"
