#!/usr/bin/env bash
# install_bigcodebench_env.sh — BigCodeBench's evaluation environment for pass_rate's
# sandbox, from Debian's packages (Debian's /usr/bin/python3 is the sandbox's default
# interpreter). The mapping is lua/metrics/lib/bigcodebench_env.tsv; the libraries Debian
# does not package are named at the end (pass_rate's check before a run names the rows
# that need them; reward.metric_options.pass_rate.missing_modules=skip leaves those out).
#   scripts/install_bigcodebench_env.sh [--dry-run]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
table="$here/lua/metrics/lib/bigcodebench_env.tsv"
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
[ "$dry" = 1 ] || $sudo apt-get update -q
pkgs=() none=() gone=()
while IFS=$'\t' read -r lib mod deb; do
  case "$lib" in ''|'#'*) continue ;; esac
  if [ "$deb" = "-" ]; then none+=("$lib"); continue; fi
  # a package this release does not have is reported, not guessed at
  if [ -z "$(apt-cache policy "$deb" 2>/dev/null | awk '/Candidate:/ && $2 != "(none)" {print $2}')" ]; then
    gone+=("$lib ($deb)"); continue
  fi
  pkgs+=("$deb")
done < "$table"
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
echo "install_bigcodebench_env: ${#pkgs[@]} Debian packages: ${pkgs[*]}"
if [ "$dry" = 0 ]; then
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
fi
if [ "${#none[@]}" -gt 0 ] || [ "${#gone[@]}" -gt 0 ]; then
  echo "install_bigcodebench_env: cannot provide from Debian: ${none[*]} ${gone[*]}" >&2
fi
