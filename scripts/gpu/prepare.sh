#!/usr/bin/env bash
# prepare.sh — run here (Debian 12, with its package mirrors): fetches the .deb files of every
# build and test dependency of clrt that the GPU image lacks (scripts/gpu/packages.sh) into
# .gpu/debs of the checkout (git-ignored), for scripts/gpu/run.sh to unpack on the GPU machine.
# Files already there at the candidate version are kept; others are removed. Prints what it
# fetched and the size that travels (sources + .gpu) against the device tool's 64 MiB.
#   bash scripts/gpu/prepare.sh
# Exit 0 done; 3 apt-get cannot download (no mirror, no apt); 1 anything else.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
. "$here/scripts/gpu/packages.sh"
kit="$here/.gpu"
debs="$kit/debs"
mkdir -p "$debs"

if ! command -v apt-get >/dev/null || ! command -v apt-cache >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "prepare: apt-get, apt-cache and dpkg-deb are needed (a Debian 12 machine)" >&2
  exit 3
fi
if [ "$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")" != bookworm ]; then
  echo "prepare: warning: this is not Debian 12 (bookworm); run.sh expects its packages" >&2
fi

# The runtime closure: Depends and Pre-Depends, recursively, without KIT_BASE.
closure="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "${KIT_RUNTIME[@]}" | grep -v '^[ <]' | sort -u)" || {
  echo "prepare: apt-cache depends failed (apt-get update first?)" >&2; exit 3; }
base_re="^($(IFS='|'; echo "${KIT_BASE[*]}" | sed 's/+/\\+/g'))\$"
pkgs=($(printf '%s\n' $closure "${KIT_DEV[@]}" | grep -Ev "$base_re" | sort -u))

# Name of the file apt-get download writes: name_version_arch.deb, ':' as %3a (one
# apt-cache call: each takes seconds).
declare -A file_of=()
while read -r name ver arch; do
  file_of[$name]="${name}_${ver//:/%3a}_${arch}.deb"
done < <(apt-cache show --no-all-versions "${pkgs[@]}" 2>/dev/null |
         awk '/^Package:/{p=$2} /^Version:/{v=$2} /^Architecture:/{a=$2} /^$/{if (p) print p, v, a; p=""} END{if (p) print p, v, a}')
want=()
for p in "${pkgs[@]}"; do
  [ -n "${file_of[$p]:-}" ] || { echo "prepare: no candidate version of $p" >&2; exit 3; }
  want+=("${file_of[$p]}")
done

# Drop files of other versions or of packages no longer in the set.
for f in "$debs"/*.deb; do
  [ -e "$f" ] || continue
  keep=0
  for w in "${want[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1 && break; done
  [ "$keep" = 1 ] || { echo "prepare: removing $(basename "$f") (not in the set)"; rm -f "$f"; }
done
missing=()
for i in "${!pkgs[@]}"; do [ -s "$debs/${want[$i]}" ] || missing+=("${pkgs[$i]}"); done
if ((${#missing[@]})); then
  echo "prepare: downloading ${#missing[@]} packages: ${missing[*]}"
  # apt-get download as root warns that _apt cannot write here; the files are written anyway.
  if ! (cd "$debs" && apt-get download -q "${missing[@]}" 2>&1 | grep -v "unsandboxed"); then :; fi
  for i in "${!pkgs[@]}"; do
    if [ ! -s "$debs/${want[$i]}" ]; then
      echo "prepare: apt-get download did not fetch ${want[$i]} (no mirror reachable?)" >&2
      exit 3
    fi
  done
else
  echo "prepare: all ${#pkgs[@]} packages already in .gpu/debs"
fi

# The newest glibc symbol version the carried binaries need: run.sh compares it with the
# GPU image's glibc (Debian 12 has 2.36; an older glibc cannot run them).
# The same set as the manifest's: its figure stands (the scan unpacks every package).
same_set() {
  [ -f "$kit/manifest.txt" ] &&
    [ "$(grep '^deb=' "$kit/manifest.txt" | cut -d' ' -f1 | cut -d= -f2 | sort)" = "$(printf '%s\n' "${want[@]}" | sort)" ]
}
glibc="$(sed -n 's/^glibc_needed=//p' "$kit/manifest.txt" 2>/dev/null || true)"
if ! same_set || [ -z "$glibc" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for f in "$debs"/*.deb; do dpkg-deb -x "$f" "$tmp/x"; done
  glibc="$(find "$tmp/x" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 |
           xargs -0 grep -aoh 'GLIBC_2\.[0-9]*' 2>/dev/null | sed 's/GLIBC_//' | sort -uV | tail -1)"
fi

{
  echo "# clrt GPU kit: Debian 12 packages, written by scripts/gpu/prepare.sh on $(date -u +%F)"
  echo "glibc_needed=$glibc"
  for i in "${!pkgs[@]}"; do echo "deb=${want[$i]} $(stat -c %s "$debs/${want[$i]}")"; done
} > "$kit/manifest.txt"

kit_bytes="$(du -cb "$debs"/*.deb "$kit/manifest.txt" | tail -1 | cut -f1)"
src_bytes=0
if git -C "$here" rev-parse >/dev/null 2>&1; then
  src_bytes="$(cd "$here" && git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/{s+=$1} END{print s+0}')"
fi
mib() { awk -v b="$1" 'BEGIN{printf "%.1f", b / 1048576}'; }
echo "prepare: ${#pkgs[@]} packages in .gpu/debs: $(mib "$kit_bytes") MiB; sources $(mib "$src_bytes") MiB;" \
     "together $(mib $((kit_bytes + src_bytes))) MiB of the device tool's 64 MiB"
echo "prepare: packages: ${pkgs[*]}"
echo "prepare: the carried binaries need glibc >= $glibc"
if ((kit_bytes + src_bytes > 60 * 1048576)); then
  echo "prepare: too large to travel with the sources (keep under 60 MiB for margin)" >&2
  exit 1
fi
