#!/usr/bin/env bash
# What the tests need beyond Rust, installed on a fresh machine (idempotent): a Python
# virtual environment at .venv with the `openai` client and selenium
# (tests/server/requirements.txt, pinned), Debian's Chromium and ChromeDriver for the chat
# page's browser test, and Mesa's lavapipe (a Vulkan driver on the CPU) with the Vulkan loader
# for the GPU backend's tests on a machine without a GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/server/requirements.txt

packages=()
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    packages+=(chromium chromium-driver)
fi
if ! compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" >/dev/null ||
    ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then
    packages+=(mesa-vulkan-drivers libvulkan1)
fi
if ((${#packages[@]})); then
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}" >/dev/null
fi
echo "test-deps: $(.venv/bin/python -c 'import openai, selenium; print("openai", openai.__version__, "selenium", selenium.__version__)'), $(chromium --version), $(ls /usr/share/vulkan/icd.d/lvp_icd.*.json)"
