#!/bin/sh
# Installs everything the test suite needs on a clean machine, system packages included:
# Debian's chromium (the browser tests drive it through Playwright, which cannot download
# a browser of its own here), Node and npm from Debian, Azurite (Azure's blob API on
# loopback, for the az:// tests) pinned from npm into .cache/azurite, and this package with
# its `test` extra.
set -eu
cd "$(dirname "$0")/.."
AZURITE_VERSION=3.35.0  # the last release that runs on Debian's Node 20 (3.36 wants 21+)
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi
if ! grep -qs "\"version\": \"$AZURITE_VERSION\"" .cache/azurite/node_modules/azurite/package.json; then
    mkdir -p .cache/azurite
    npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION"
fi
python3 -m pip install -q -e '.[test]'
