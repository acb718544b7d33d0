# tmux_lib.sh — what the terminal tests share: a private tmux server, reading the pane,
# waiting for text, counting results. Source it after setting SESSION (the tmux session name).
# Provides: T (tmux on our socket), pane, wait_for TEXT [SECONDS], expect WHAT TEXT [SECONDS],
# check WHAT SHELL-CONDITION, type_line TEXT, summary (prints "N passed, N failed", returns).
command -v tmux >/dev/null || { echo "skip: tmux is not installed"; exit 77; }
tmp="$(mktemp -d /tmp/clrt-tmux.XXXXXX)"
sock="clrt-test-$$"
export TMUX_TMPDIR="$tmp"
T() { tmux -L "$sock" "$@"; }
cleanup() { T kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
passes=0
fails=0
pane() { T capture-pane -p -J -S -1000 -t "$SESSION" 2>/dev/null; }
wait_for() {
  local want="$1" limit="${2:-10}" i
  for ((i = 0; i < limit * 20; i++)); do
    pane | grep -qF -- "$want" && return 0
    sleep 0.05
  done
  return 1
}
pass() { echo "ok    $1"; passes=$((passes + 1)); }
fail() { echo "FAIL  $1"; fails=$((fails + 1)); }
expect() {
  if wait_for "$2" "${3:-10}"; then pass "$1"; else
    fail "$1: '$2' never appeared; the pane shows:"; pane | sed 's/^/      | /'; fi
}
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }
type_line() { T send-keys -t "$SESSION" -l -- "$1"; T send-keys -t "$SESSION" Enter; }
summary() { echo "$passes passed, $fails failed"; [ "$fails" -eq 0 ]; }
