# .ci/lib.sh: what the measuring scripts (bench.sh, wscrowd.sh) share.
# Source it from the repository's root with NAME set: say prefixes NAME.

say() { printf '%s: %s\n' "$NAME" "$*" >&2; }
die() { say "FATAL: $*"; exit 1; }

# answers PORT: something accepts connections on 127.0.0.1:PORT.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# free_port: a port nothing listens on, picked at random from 20000 up to
# the kernel's ephemeral range (net.ipv4.ip_local_port_range; 32768 on by
# default): a free port inside it can be an outgoing connection's by the
# time the server binds it, which a run that opened ~20k sockets makes
# likely. At random, so runs side by side and a stray server left on a
# fixed port cannot answer for this run's processes.
TAKEN=" "
EPHEMERAL_START=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
  local p span=$((EPHEMERAL_START - 20000))
  [ "$span" -ge 1000 ] || die "the kernel's ephemeral ports start at $EPHEMERAL_START: free_port needs 20000-20999 outside them (sysctl net.ipv4.ip_local_port_range)"
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % span))
    if [[ $TAKEN != *" $p "* ]] && ! answers "$p"; then
      TAKEN+="$p "
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}

# A run's own names and its clean-up: a temporary folder (WORK), the
# processes it starts (PIDS), the checkouts it adds (REV_TREES), a MariaDB
# database (DB) and the Redis keys of
# its campaigns ("$NAME-$RUN_ID-…") and queue (TOPIC), all removed on exit.
WORK=$(mktemp -d)
PIDS=()
REV_TREES=()
RUN_ID=$(date +%s)$RANDOM
DB=fs_${NAME}_$RUN_ID
TOPIC=$NAME-$RUN_ID
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  mariadb -h 127.0.0.1 -uroot -e "DROP DATABASE IF EXISTS $DB" 2>/dev/null || true
  for pattern in "fs:{$NAME-$RUN_ID-*" "fsq:{$TOPIC*"; do
    redis-cli -h 127.0.0.1 --scan --pattern "$pattern" | xargs -r -n 500 redis-cli -h 127.0.0.1 del >/dev/null
  done
  # A Redis Cluster the run started (bench.sh, BENCH_REDIS_CLUSTER=1).
  if [ -n "${CLUSTER_DIR:-}" ]; then
    "$WORK/testcluster" stop "$CLUSTER_DIR" 2>/dev/null || say "could not stop the Redis Cluster in $CLUSTER_DIR"
  fi
  # Checkouts of other revisions (bench.sh, BENCH_REVS).
  for tree in "${REV_TREES[@]}"; do
    git worktree remove --force "$tree" 2>/dev/null || say "could not remove the checkout $tree"
  done
  [ "${#REV_TREES[@]}" = 0 ] || git worktree prune
  rm -rf "$WORK"
}
trap cleanup EXIT
