#!/bin/sh
# Installs everything the test suite needs on a clean machine, system packages included:
# Debian's chromium (the browser tests drive it through Playwright, which cannot download
# a browser of its own here) and this package with its `test` extra.
set -eu
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
python3 -m pip install -q -e '.[test]'
