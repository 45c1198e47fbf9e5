# .ci/lib.sh: what the measuring scripts (bench.sh, wscrowd.sh) share.
# Source it from the repository's root with NAME set: say prefixes NAME.

say() { printf '%s: %s\n' "$NAME" "$*" >&2; }
die() { say "FATAL: $*"; exit 1; }

# answers PORT: something accepts connections on 127.0.0.1:PORT.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# free_port: a port nothing listens on, picked at random above the
# ephemeral range's usual start, so runs side by side and a stray server
# left on a fixed port cannot answer for this run's processes.
TAKEN=" "
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    if [[ $TAKEN != *" $p "* ]] && ! answers "$p"; then
      TAKEN+="$p "
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}
