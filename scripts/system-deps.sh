#!/usr/bin/env bash
# Install the Debian packages that integration tests and `make run` use, only when missing.
# Idempotent; needs root (as on CI and dev machines here) or passwordless sudo.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
# the dispatcher's Alertmanager push is tested against a real Alertmanager
command -v prometheus-alertmanager >/dev/null 2>&1 || [ -x /usr/bin/prometheus-alertmanager ] \
  || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the console marks severities with emoji; without a colour emoji font the test browser (and
# the screenshots in docs/console.md) drew them as empty boxes
[ -f /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf ] || need+=(fonts-noto-color-emoji)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
