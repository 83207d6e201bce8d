#!/usr/bin/env bash
# Fetch the JVM artifacts listed in deps/<name>/pom.xml into .cache/jars/<name>/, idempotently.
# Usage: scripts/fetch-jars.sh kafka [spark-kafka ...]
# A stamp holding the manifest's hash marks a complete copy: an unchanged manifest is not
# fetched again, a changed one replaces the folder. Installs Maven from Debian when missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${APP_JARS_CACHE:-$root/.cache/jars}"
if ! command -v mvn >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
  echo "installing maven (and a Java 17 JDK: javac builds jobs/local_fs.py's jar) from Debian"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends maven openjdk-17-jdk-headless >/dev/null
fi
for name in "$@"; do
  pom="$root/deps/$name/pom.xml"
  [ -f "$pom" ] || { echo "fetch-jars: no manifest $pom" >&2; exit 2; }
  dest="$cache/$name"
  hash="$(sha1sum "$pom" | cut -c1-12)"
  [ -f "$dest/.complete-$hash" ] && continue
  echo "fetching $name jars (deps/$name/pom.xml) into $dest"
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/.$name.XXXXXX")"
  if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$tmp" >"$tmp.log" 2>&1; then
    cat "$tmp.log" >&2; rm -rf "$tmp" "$tmp.log"
    echo "fetch-jars: maven could not resolve deps/$name/pom.xml (see above)" >&2; exit 1
  fi
  rm -f "$tmp.log"; touch "$tmp/.complete-$hash"
  rm -rf "$dest"; mv "$tmp" "$dest"
done
