#!/usr/bin/env bash
# The admin dashboard tests drive Debian's Chromium through Playwright; install it when missing.
set -u
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/tmp/fairserve-chromium-install.log 2>&1 \
    || echo "chromium install failed; see /tmp/fairserve-chromium-install.log" >&2
fi
exit 0
