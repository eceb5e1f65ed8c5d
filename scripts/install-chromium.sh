#!/usr/bin/env bash
# Install Debian's chromium for the HTML report's headless-browser tests; do nothing when it is there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "install-chromium: /usr/bin/chromium already installed ($(/usr/bin/chromium --version 2>/dev/null || echo 'version unknown'))"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-chromium: /usr/bin/chromium is missing and installing it needs root (apt-get install chromium)" >&2
  exit 1
fi
echo "install-chromium: /usr/bin/chromium missing; installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
echo "install-chromium: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
