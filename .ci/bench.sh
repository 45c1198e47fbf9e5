#!/usr/bin/env bash
# .ci/bench.sh: the performance baseline of docs/BENCHMARKS.md, in one run on
# this machine, with everything co-located (load generator, flashsale, Redis,
# MariaDB share the same cores). It measures, as requests per second and as a
# ratio to the first:
#   1. bare gin "hello" (.ci/benchhello): the ceiling
#   2. the admit path: `flashsale gateway`, every purchase admitted (202)
#   3. the sold-out path: `flashsale serve`, every purchase refused (410)
#   4. 100,000 shoppers vs 1,000 items end to end: `flashsale loadtest` against
#      `flashsale serve` on the Redis-Streams queue, real Redis and MariaDB
# Stages 1-3 are driven by wrk (installed if missing) with the same request;
# stage 4 by the loadtest tool, which also checks every invariant.
# Not in the default stages, "gate" (issue 17): the gateway, worker and
# notifier as three processes, and BENCH_GATE_ROUNDS (5) rounds of three
# loadtest sales of BENCH_GATE_SHOPPERS (20000) shoppers, every purchase
# admitted, in turn (order reversed every other round): "off" (no gate),
# "fetch" (a challenge fetched before each purchase, nothing checked: the
# GET's cost) and "gate" (--challenge-bits BENCH_GATE_BITS, 4: fetched,
# solved, verified and spent); it prints the gateway's CPU per admitted
# purchase of each sale and the medians of the per-round ratios to "off".
#
# Not part of .ci/run. Tunables: BENCH_DURATION (10s), BENCH_CONNECTIONS (128),
# BENCH_THREADS (1: wrk keeps at most one core), BENCH_SHOPPERS (100000),
# BENCH_STOCK (1000), BENCH_STAGES (hello,admit,soldout,e2e: the stages to
# run; ratios need hello), BENCH_LOADTEST_ARGS (flags added to the e2e
# loadtest, which win over its own: '--results poll' for the WebSocket/poll
# A/B of the server's CPU per purchase, '--ws-per-shopper' for a crowd, whose
# CPU per request then includes its connects and the wait after it leaves). Settings of flashsale pass through the
# environment, e.g. FLASHSALE_GATEWAY_ADMIT_LINGER=0 for an A/B. BENCH_PROFILE=DIR also writes a CPU profile of the server
# during each stage to DIR/<stage>.pb.gz, and of the loadtest during an
# end-to-end stage to DIR/<stage>-loadtest.pb.gz (`go tool pprof -top -cum FILE`;
# BENCH_E2E_PROFILE_SECONDS=N: e2e's over its first N seconds, not 3 from 1):
# the binaries then get net/http/pprof through `go build -overlay` from a file
# made in the run's temporary folder, so nothing in the tree imports it.
# Profiling costs the server a few per cent; compare profiled runs only with
# profiled runs.
# BENCH_REDIS_CLUSTER=1 also starts a Redis Cluster of the run's own (3
# masters + 3 replicas, internal/testenv/testcluster, in WORK; stopped by
# the clean-up) and runs the admit and e2e stages a second time on it
# (redis.mode cluster), plus the stage "deduct": BenchmarkDeductShards,
# deduct.lua's deductions/s on the one Redis and on the cluster; the rows
# marked "cluster" are the comparison of docs/BENCHMARKS.md's issue 18.
# Not in the default stages, "ack" (with BENCH_REDIS_CLUSTER=1): the e2e
# stage on the cluster with redis.min_replicas_ack 0 and 1 in turn,
# BENCH_ACK_ROUNDS (3) rounds; with BENCH_SHOPPERS = BENCH_STOCK every
# purchase is a deduction the worker waits on. Not in the default stages,
# "degraded": the sale decided in MySQL while Redis is down (issue 28),
# beside a bare conditional UPDATE loop and the Redis path, in
# BENCH_DEGRADED_ROUNDS (3) rounds of BENCH_DEGRADED_STOCK (20000) units
# (see the stage).
#
# BENCH_REVS="A B" compares two git revisions instead: each is checked out
# (git worktree, in the run's temporary folder, removed by the clean-up) and
# built, then the chosen stages run at A, B, then B, A, ... for BENCH_ROUNDS
# (3; an even number gives each revision each place as often) rounds, each run a bench.sh of its own with that revision's binaries and
# configs/production.yaml; it prints each stage's medians (req/s, server and
# Redis CPU per request) and the ratios B/A. The stage "gobench" (revisions
# only) runs the Go benchmarks of internal/store matching BENCH_GO_BENCH
# ('^Benchmark(Admit|Deduct)$') for BENCH_GO_BENCHTIME (1s) at each
# revision in the same alternation and compares them with benchstat (go run,
# from the Go module proxy), on the test Redis (127.0.0.1:6379). E.g.
# BENCH_REVS="main HEAD" BENCH_STAGES=admit,gobench. BENCH_PROFILE and the
# stage deduct do not apply to it.
set -euo pipefail
cd "$(dirname "$0")/.."

SELF=$PWD/.ci/bench.sh
DURATION=${BENCH_DURATION:-10s}
CONNS=${BENCH_CONNECTIONS:-128}
THREADS=${BENCH_THREADS:-1}
SHOPPERS=${BENCH_SHOPPERS:-100000}
STOCK=${BENCH_STOCK:-1000}
CLUSTER=${BENCH_REDIS_CLUSTER:-0}
STAGES=${BENCH_STAGES:-hello,admit,soldout,e2e}
[ "$CLUSTER" = 1 ] && [ -z "${BENCH_STAGES:-}" ] && STAGES+=,deduct
want() { [[ ",$STAGES," == *",$1,"* ]]; }
REDIS_ADDR=127.0.0.1:6379

NAME=bench
# shellcheck source=.ci/lib.sh
source .ci/lib.sh
PORT=$(free_port)
HELLO_PORT=$(free_port)

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
mariadb_up() { mariadb -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" >/dev/null 2>&1; }
redis_up || die "Redis is not answering on $REDIS_ADDR (bash .ci/run starts it)"
mariadb_up || die "MariaDB is not answering on 127.0.0.1:3306 (bash .ci/run starts it)"
if ! command -v wrk >/dev/null; then
  say "installing wrk"
  { apt-get update -qq && apt-get install -y -qq wrk; } >/dev/null || die "could not install wrk (apt-get install wrk)"
fi

# WORK, PIDS, RUN_ID, DB, TOPIC and the clean-up come from .ci/lib.sh.

# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR]=$1} END{if(NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }

# Two revisions: build both, run the stages at each in turn, compare.
if [ -n "${BENCH_REVS:-}" ]; then
  read -r -a REVS <<<"$BENCH_REVS"
  [ "${#REVS[@]}" = 2 ] || die "BENCH_REVS takes two revisions, e.g. 'HEAD~1 HEAD'"
  [ -z "${BENCH_PROFILE:-}" ] || die "BENCH_PROFILE does not apply to BENCH_REVS"
  # The deduct stage runs this tree's benchmark, whatever the revision.
  ! want deduct || die "the deduct stage does not apply to BENCH_REVS (set BENCH_STAGES; gobench compares Go benchmarks)"
  ROUNDS=${BENCH_ROUNDS:-3}
  GO_BENCH=${BENCH_GO_BENCH:-'^Benchmark(Admit|Deduct)$'}
  RUN_STAGES=$(tr , '\n' <<<"$STAGES" | grep -vx gobench | paste -sd, || true)
  SHAS=()
  for i in 0 1; do
    SHAS[i]=$(git rev-parse --short --verify "${REVS[i]}^{commit}") || die "no revision ${REVS[i]}"
    tree=$WORK/rev$i
    git worktree add --quiet --detach "$tree" "${SHAS[i]}" || die "could not check out ${REVS[i]}"
    REV_TREES+=("$tree") # .ci/lib.sh's clean-up removes them
    say "building ${REVS[i]} (${SHAS[i]})"
    mkdir -p "$WORK/bin$i"
    (cd "$tree" && go build -o "$WORK/bin$i/flashsale" ./cmd/flashsale && go build -o "$WORK/bin$i/hello" ./.ci/benchhello) \
      || die "could not build ${REVS[i]}"
    if want gobench; then
      (cd "$tree" && go test -c -o "$WORK/bin$i/store.test" ./internal/store) || die "could not build ${REVS[i]}'s store tests"
    fi
  done
  mkdir -p "$WORK/gobench"
  for round in $(seq 1 "$ROUNDS"); do
    # A B, then B A, ...: the second of a pair ran up to 1.26 x the CPU per
    # request of the first in e2e on identical code (docs/BENCHMARKS.md),
    # so each revision takes each place in turn.
    order="0 1"
    [ $((round % 2)) = 1 ] || order="1 0"
    for i in $order; do
      if [ -n "$RUN_STAGES" ]; then
        say "round $round of $ROUNDS: $RUN_STAGES at ${REVS[i]} (${SHAS[i]})"
        BENCH_REVS='' BENCH_BIN=$WORK/bin$i BENCH_CONFIG=$WORK/rev$i/configs/production.yaml BENCH_STAGES=$RUN_STAGES \
          BENCH_RESULTS=$WORK/results$i bash "$SELF" >"$WORK/run-$round-$i.txt" \
          || { cat "$WORK/run-$round-$i.txt" >&2; die "round $round at ${REVS[i]} failed"; }
      fi
      if want gobench; then
        say "round $round of $ROUNDS: go test -bench '$GO_BENCH' ./internal/store at ${REVS[i]} (${SHAS[i]})"
        (cd "$WORK/rev$i/internal/store" && CI=true FLASHSALE_TEST_REDIS_ADDR=$REDIS_ADDR "$WORK/bin$i/store.test" \
          -test.run '^$' -test.bench "$GO_BENCH" -test.benchtime "${BENCH_GO_BENCHTIME:-1s}") >>"$WORK/gobench/$i.txt" 2>&1 \
          || { cat "$WORK/gobench/$i.txt" >&2; die "the Go benchmarks failed at ${REVS[i]}"; }
      fi
    done
  done
  echo
  echo "flashsale bench: A = ${REVS[0]} (${SHAS[0]}), B = ${REVS[1]} (${SHAS[1]}); $ROUNDS rounds, A B then B A; $(nproc) cores, load now $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -n "$RUN_STAGES" ]; then
    printf '%-16s %10s %10s %6s   %14s %14s %6s   %14s %14s %6s\n' stage "A req/s" "B req/s" "B/A" "A server us/rq" "B server us/rq" "B/A" "A redis us/rq" "B redis us/rq" "B/A"
    for st in $(cut -d' ' -f1 "$WORK/results0" | awk '!seen[$0]++'); do
      row=()
      for col in 2 3 4; do
        a=$(awk -v s="$st" -v c=$col '$1 == s {print $c}' "$WORK/results0" | median)
        b=$(awk -v s="$st" -v c=$col '$1 == s {print $c}' "$WORK/results1" | median)
        row+=("$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{if(a>0) printf "%.3f", b/a; else print "n/a"}')")
      done
      printf '%-16s %10.0f %10.0f %6s   %14.1f %14.1f %6s   %14.1f %14.1f %6s\n' "$st" "${row[@]}"
    done
    echo "(medians of $ROUNDS runs each)"
  fi
  if want gobench; then
    echo
    echo "Go benchmarks of internal/store, '$GO_BENCH', -benchtime ${BENCH_GO_BENCHTIME:-1s}, A = 0.txt, B = 1.txt:"
    (cd "$WORK/gobench" && go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da 0.txt 1.txt) \
      || die "benchstat failed (it comes from the Go module proxy)"
  fi
  exit 0
fi

say "building"
BUILD_FLAGS=()
PPROF_ADDR=127.0.0.1:$(free_port)
if [ -n "${BENCH_PROFILE:-}" ]; then
  mkdir -p "$BENCH_PROFILE"
  BENCH_PROFILE=$(cd "$BENCH_PROFILE" && pwd)
  cat >"$WORK/zz_bench_pprof.go" <<'EOF'
package main

import (
	"net/http"
	_ "net/http/pprof" // bench.sh's profiles only: never in the tree
	"os"
)

func init() {
	if addr := os.Getenv("BENCH_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
EOF
  printf '{"Replace":{"%s":"%s","%s":"%s"}}\n' \
    "$PWD/cmd/flashsale/zz_bench_pprof.go" "$WORK/zz_bench_pprof.go" \
    "$PWD/.ci/benchhello/zz_bench_pprof.go" "$WORK/zz_bench_pprof.go" >"$WORK/overlay.json"
  BUILD_FLAGS=(-overlay "$WORK/overlay.json")
  export BENCH_PPROF_ADDR=$PPROF_ADDR
fi
if [ -n "${BENCH_BIN:-}" ]; then # binaries built by the BENCH_REVS run
  cp "$BENCH_BIN/flashsale" "$BENCH_BIN/hello" "$WORK/"
else
  go build "${BUILD_FLAGS[@]}" -o "$WORK/flashsale" ./cmd/flashsale
  go build "${BUILD_FLAGS[@]}" -o "$WORK/hello" ./.ci/benchhello
fi
mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE $DB"
if [ "$CLUSTER" = 1 ]; then
  say "starting a Redis Cluster (3 masters + 3 replicas)"
  go build -o "$WORK/testcluster" ./internal/testenv/testcluster
  CLUSTER_DIR=$WORK/cluster # .ci/lib.sh's clean-up stops it
  mkdir -p "$CLUSTER_DIR"
  CLUSTER_ADDRS=$("$WORK/testcluster" start "$CLUSTER_DIR") || die "could not start a Redis Cluster"
  CLUSTER_PIDS=$(cat "$CLUSTER_DIR"/node-*.pid | tr '\n' ' ')
  # The one Redis it is compared with is a private one too, configured as
  # the nodes are (no persistence): 127.0.0.1:6379 serves every test run on
  # this machine, whose load would be charged to the one-Redis rows.
  SINGLE_PORT=$(free_port)
  redis-server --port "$SINGLE_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" --logfile redis-single.log &
  PIDS+=($!)
  REDIS_ADDR=127.0.0.1:$SINGLE_PORT
  for _ in $(seq 1 50); do redis-cli -p "$SINGLE_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
fi

export FLASHSALE_HTTP_ADDR=127.0.0.1:$PORT
export FLASHSALE_REDIS_ADDR=$REDIS_ADDR
export FLASHSALE_DATABASE_DSN="root@tcp(127.0.0.1:3306)/$DB"
export FLASHSALE_AUTH_JWT_SECRET=bench-jwt-secret-0123456789abcdef0123456789
export FLASHSALE_AUTH_ADMIN_TOKEN=bench-admin-token
export FLASHSALE_PAYMENT_WEBHOOK_SECRET=bench-webhook-secret-0123456789abcdef0123
export FLASHSALE_QUEUE_TOPIC=$TOPIC FLASHSALE_QUEUE_EXPIRY_TOPIC=$TOPIC-expiry
export FLASHSALE_LOG_LEVEL=warn
# configs/production.yaml picks RocketMQ (docker compose); the baseline is
# measured on the Redis-Streams queue of the real Redis.
export FLASHSALE_QUEUE_DRIVER=redisstream
# wrk replays 256 shoppers' tokens from one address: the per-user and
# per-IP limits stay on (their Lua runs for every request) but high enough
# that no request is refused by them.
export FLASHSALE_GATEWAY_USER_RATE=1000000 FLASHSALE_GATEWAY_USER_BURST=1000000
export FLASHSALE_GATEWAY_IP_RATE=1000000 FLASHSALE_GATEWAY_IP_BURST=1000000
# The loadtest's WebSockets all come from this host too.
export FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=1000000
CONFIG=${BENCH_CONFIG:-configs/production.yaml}
BASE=http://127.0.0.1:$PORT
ADMIN="Authorization: Bearer $FLASHSALE_AUTH_ADMIN_TOKEN"

for i in $(seq 1 256); do "$WORK/flashsale" token --config "$CONFIG" "bench$i"; done >"$WORK/tokens"

cat >"$WORK/purchase.lua" <<'EOF'
-- One purchase per request, round-robin over the shoppers' tokens.
local tokens = {}
for line in io.lines(os.getenv("BENCH_TOKENS")) do tokens[#tokens + 1] = line end
local path = os.getenv("BENCH_PATH")
local i = 0
wrk.method = "POST"
wrk.body = '{"quantity":1}'
request = function()
  i = i + 1
  return wrk.format(nil, path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. tokens[i % #tokens + 1],
  })
end
EOF
export BENCH_TOKENS=$WORK/tokens

# wait_http URL PID: wait until URL answers, and make sure it is PID that
# answers: the port was free when picked, and PID must still run (a process
# that failed to bind would leave the answer to whoever took the port).
wait_http() {
  for _ in $(seq 1 100); do
    kill -0 "$2" 2>/dev/null || die "process $2 exited before $1 answered (its log is in $WORK)"
    curl -fs -o /dev/null "$1" && return 0
    sleep 0.1
  done
  die "$1 did not answer"
}

# cpu_ticks PID...: user+system clock ticks used so far by the processes.
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}
all_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
HZ=$(getconf CLK_TCK)
REDIS_PID=$(redis-cli -h 127.0.0.1 -p "${REDIS_ADDR#*:}" info server | sed -n 's/^process_id:\([0-9]*\).*/\1/p')
REDIS_PID=${REDIS_PID:-$(pgrep -o -x redis-server || true)}
# use_redis single|cluster: the Redis the next processes use, whose
# redis-server processes the CPU figures count (all six nodes of the
# cluster: replicas copy every write) and whose command statistics count
# admit.lua calls (REDIS_NODES, host:port).
use_redis() {
  if [ "$1" = cluster ]; then
    export FLASHSALE_REDIS_MODE=cluster FLASHSALE_REDIS_ADDRS=$CLUSTER_ADDRS
    REDIS_PIDS=$CLUSTER_PIDS REDIS_NODES=${CLUSTER_ADDRS//,/ }
  else
    export FLASHSALE_REDIS_MODE=server
    unset FLASHSALE_REDIS_ADDRS
    REDIS_PIDS=$REDIS_PID REDIS_NODES=$REDIS_ADDR
  fi
}
use_redis single
# evalsha_calls: EVALSHA calls since the last reset, over every node.
evalsha_calls() {
  local n total=0
  for n in $REDIS_NODES; do
    total=$((total + $(redis-cli -h "${n%:*}" -p "${n#*:}" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' | awk '{s+=$1} END{print s+0}')))
  done
  echo "$total"
}
reset_stats() { local n; for n in $REDIS_NODES; do redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done; }
MARIADB_PID=$(pgrep -o -x mariadbd || true)

# profile NAME SECONDS [DELAY] [ADDR]: with BENCH_PROFILE, a CPU profile of
# the server (or of the process serving pprof on ADDR) in the background,
# starting DELAY seconds (1) into the stage.
profile() {
  [ -n "${BENCH_PROFILE:-}" ] || return 0
  (sleep "${3:-1}"; curl -fs -o "$BENCH_PROFILE/$1.pb.gz" "http://${4:-$PPROF_ADDR}/debug/pprof/profile?seconds=$2" \
    || say "no profile for $1") &
  PROFILE_PIDS+=($!)
}
PROFILE_PIDS=()
PROFILE_SECONDS=5 # within the stage: wrk's duration less the first and last second
if [[ $DURATION =~ ^([0-9]+)s$ ]] && [ "${BASH_REMATCH[1]}" -gt 3 ]; then PROFILE_SECONDS=$((BASH_REMATCH[1] - 2)); fi

# record NAME REQUESTS SERVER_TICKS REDIS_TICKS: with BENCH_RESULTS (set by
# the BENCH_REVS run), the line "NAME req/s server-us/req redis-us/req".
record() {
  [ -n "${BENCH_RESULTS:-}" ] || return 0
  awk -v name="$1" -v rps="${RPS[$1]}" -v n="$2" -v s="$3" -v r="$4" -v hz="$HZ" \
    'BEGIN{if(n<1)n=1; printf "%s %s %.1f %.1f\n", name, rps, 1e6*s/hz/n, 1e6*r/hz/n}' >>"$BENCH_RESULTS"
}

# load NAME URL_PATH SERVER_PID: wrk against the path; prints req/s and the
# CPU split of the run, and records the non-2xx count.
declare -A RPS NON2XX CPU DEDUCT SALE_CPU
load() {
  local name=$1 path=$2 server=$3 out t0 s0 r0 m0 t1 s1 r1 m1
  # shellcheck disable=SC2086 # REDIS_PIDS is a list
  t0=$(all_ticks) s0=$(cpu_ticks "$server") r0=$(cpu_ticks $REDIS_PIDS) m0=$(cpu_ticks "$MARIADB_PID")
  profile "$name" "$PROFILE_SECONDS"
  out=$(BENCH_PATH=$path wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s "$WORK/purchase.lua" "http://127.0.0.1:$4")
  # shellcheck disable=SC2086
  t1=$(all_ticks) s1=$(cpu_ticks "$server") r1=$(cpu_ticks $REDIS_PIDS) m1=$(cpu_ticks "$MARIADB_PID")
  RPS[$name]=$(awk '/^Requests\/sec:/{printf "%.0f", $2}' <<<"$out")
  NON2XX[$name]=$(awk '/Non-2xx or 3xx responses:/{print $5}' <<<"$out")
  NON2XX[$name]=${NON2XX[$name]:-0}
  local all=$((t1 - t0)) srv=$((s1 - s0)) red=$((r1 - r0)) mdb=$((m1 - m0)) reqs
  reqs=$(awk '/requests in/{print $1}' <<<"$out")
  # CPU time per request is steadier than req/s when something else runs.
  CPU[$name]=$(awk -v a="$all" -v s="$srv" -v r="$red" -v m="$mdb" -v n="$reqs" -v hz="$HZ" \
    'BEGIN{if(a<1)a=1; if(n<1)n=1; printf "server %.0f us/req + redis %.0f us/req; CPU split: server %d%%, redis %d%%, mariadb %d%%, wrk+rest %d%%", 1e6*s/hz/n, 1e6*r/hz/n, 100*s/a, 100*r/a, 100*m/a, 100*(a-s-r-m)/a}')
  say "$name: ${RPS[$name]} req/s (non-2xx ${NON2XX[$name]}; ${CPU[$name]})"
  record "$name" "$reqs" "$srv" "$red"
  printf '%s\n' "$out" >"$WORK/wrk-$name.txt"
}

campaign() { # id stock: create and preload an open campaign
  local now
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  curl -fs -o /dev/null -XPOST "$BASE/admin/v1/campaigns" -H "$ADMIN" -H 'Content-Type: application/json' \
    -d "{\"id\":\"$1\",\"name\":\"bench\",\"stock\":$2,\"per_user_limit\":1000,\"start_at\":\"2020-01-01T00:00:00Z\",\"end_at\":\"2099-01-01T00:00:00Z\"}" \
    || die "create campaign $1"
  curl -fs -o /dev/null -XPOST "$BASE/admin/v1/campaigns/$1/preload" -H "$ADMIN" || die "preload $1"
}

say "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo); wrk -t$THREADS -c$CONNS -d$DURATION"
say "load before the run: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews every figure)"

# 1. The ceiling.
if want hello; then
  "$WORK/hello" -addr "127.0.0.1:$HELLO_PORT" &
  PIDS+=($!)
  for _ in $(seq 1 50); do answers "$HELLO_PORT" && break; sleep 0.1; done
  kill -0 "${PIDS[-1]}" 2>/dev/null || die "the bare gin handler exited (port $HELLO_PORT taken?)"
  load hello /api/v1/campaigns/x/purchases "${PIDS[-1]}" "$HELLO_PORT"
  kill "${PIDS[-1]}"
fi

# 2. The admit path: the gateway role alone, so no worker shares the cores;
# every request is admitted and published. Its own topic keeps the later
# serve's workers from draining this backlog during stages 3 and 4.
# Purchases per admit.lua call (the admit batch size) come from Redis's
# command statistics, reset when the stage starts.
# admit_stage NAME: the stage on the Redis of use_redis, recorded as NAME.
admit_stage() {
  local name=$1 gw acc calls batch
  FLASHSALE_QUEUE_TOPIC=$TOPIC-$name "$WORK/flashsale" gateway --config "$CONFIG" >"$WORK/gateway-$name.log" 2>&1 &
  PIDS+=($!)
  gw=${PIDS[-1]}
  wait_http "$BASE/healthz" "$gw"
  acc=bench-$RUN_ID-$name
  campaign "$acc" 10000000
  reset_stats
  load "$name" "/api/v1/campaigns/$acc/purchases" "$gw" "$PORT"
  calls=$(evalsha_calls)
  batch=$(awk -v n="$(awk '/requests in/{print $1}' "$WORK/wrk-$name.txt")" -v c="${calls:-0}" 'BEGIN{if(c>0) printf "%.1f", n/c; else print "?"}')
  CPU[$name]="${CPU[$name]}; $batch purchases per admit.lua call"
  kill "$gw"
  wait "$gw" 2>/dev/null || true
}
if want admit; then
  admit_stage admit
fi

# The gate: its CPU per admitted purchase, A/B/C in one run.
if want gate; then
  GATE_ROUNDS=${BENCH_GATE_ROUNDS:-5} GATE_SHOPPERS=${BENCH_GATE_SHOPPERS:-20000} GATE_BITS=${BENCH_GATE_BITS:-4}
  GATE_GW_PORT=$(free_port) GATE_NT_PORT=$(free_port) GATE_WK_PORT=$(free_port)
  gate_role() { # role port: one role on its own port and topic
    FLASHSALE_QUEUE_TOPIC=$TOPIC-gate FLASHSALE_HTTP_ADDR=127.0.0.1:$2 "$WORK/flashsale" "$1" --config "$CONFIG" >"$WORK/gate-$1.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$2/healthz" "$!"
  }
  gate_role gateway "$GATE_GW_PORT"
  GATE_GW=${PIDS[-1]}
  gate_role worker "$GATE_WK_PORT"
  gate_role notifier "$GATE_NT_PORT"
  declare -A GATE_US
  gate_sale() { # variant round: one sale; records the gateway's us per admitted purchase
    local flags=() s0 s1 r0 r1 admitted
    case $1 in
      fetch) flags=(--challenge-fetch) ;;
      gate) flags=(--challenge-bits "$GATE_BITS") ;;
    esac
    s0=$(cpu_ticks "$GATE_GW") r0=$(cpu_ticks "$REDIS_PID")
    "$WORK/flashsale" loadtest --url "http://127.0.0.1:$GATE_GW_PORT" --results-url "http://127.0.0.1:$GATE_NT_PORT" \
      --campaign "bench-$RUN_ID-gate-$1-$2" --stock "$GATE_SHOPPERS" --shoppers "$GATE_SHOPPERS" --concurrency 128 \
      --repeat 0 --idempotent-share 0 --results poll --settle 60 --progress=false --json "${flags[@]}" >"$WORK/gate-$1-$2.json" \
      || die "gate stage: loadtest $1 failed (report in $WORK/gate-$1-$2.json)"
    s1=$(cpu_ticks "$GATE_GW") r1=$(cpu_ticks "$REDIS_PID")
    admitted=$(sed -n 's/^  "admitted": \([0-9]*\),$/\1/p' "$WORK/gate-$1-$2.json")
    [ "${admitted:-0}" -gt 0 ] || die "gate stage: $1 admitted nothing"
    GATE_US[$1,$2]=$(awk -v s="$((s1 - s0))" -v n="$admitted" -v hz="$HZ" 'BEGIN{printf "%.1f", 1e6*s/hz/n}')
    say "gate round $2 $1: gateway ${GATE_US[$1,$2]} us per admitted purchase ($admitted admitted; redis $(awk -v r="$((r1 - r0))" -v n="$admitted" -v hz="$HZ" 'BEGIN{printf "%.1f", 1e6*r/hz/n}') us)"
  }
  for round in $(seq 1 "$GATE_ROUNDS"); do
    order="off fetch gate"
    if [ $((round % 2)) = 0 ]; then order="gate fetch off"; fi
    for v in $order; do gate_sale "$v" "$round"; done
  done
  GATE_FETCH=$(for r in $(seq 1 "$GATE_ROUNDS"); do awk -v a="${GATE_US[fetch,$r]}" -v b="${GATE_US[off,$r]}" 'BEGIN{printf "%.3f\n", a/b}'; done | median)
  GATE_GATE=$(for r in $(seq 1 "$GATE_ROUNDS"); do awk -v a="${GATE_US[gate,$r]}" -v b="${GATE_US[off,$r]}" 'BEGIN{printf "%.3f\n", a/b}'; done | median)
  GATE_VERIFY=$(for r in $(seq 1 "$GATE_ROUNDS"); do awk -v a="${GATE_US[gate,$r]}" -v b="${GATE_US[fetch,$r]}" 'BEGIN{printf "%.3f\n", a/b}'; done | median)
  GATE_LINE="off $(for r in $(seq 1 "$GATE_ROUNDS"); do printf '%s ' "${GATE_US[off,$r]}"; done)| fetch $(for r in $(seq 1 "$GATE_ROUNDS"); do printf '%s ' "${GATE_US[fetch,$r]}"; done)| gate $(for r in $(seq 1 "$GATE_ROUNDS"); do printf '%s ' "${GATE_US[gate,$r]}"; done)"
  for pid in "${PIDS[@]: -3}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
fi

# 3 and 4 run on the whole system.
if want soldout || want e2e; then
  "$WORK/flashsale" serve --config "$CONFIG" >"$WORK/serve.log" 2>&1 &
  PIDS+=($!)
  SRV=${PIDS[-1]}
  wait_http "$BASE/healthz" "$SRV"
fi

if want soldout; then
  SO=bench-$RUN_ID-soldout
  campaign "$SO" 1
  curl -fs -o /dev/null -XPOST "$BASE/api/v1/campaigns/$SO/purchases" -H "Authorization: Bearer $(head -1 "$WORK/tokens")" \
    -H 'Content-Type: application/json' -d '{"quantity":1}' || die "buy the only unit"
  for _ in $(seq 1 100); do
    curl -fs "$BASE/api/v1/campaigns/$SO" | grep -q '"sold_out":true' && break
    sleep 0.1
  done
  load soldout "/api/v1/campaigns/$SO/purchases" "$SRV" "$PORT"
fi

E2E_STATUS=0
json() { sed -n "s/^  \"$1\": \\([^,]*\\),\\{0,1\\}\$/\\1/p" "$WORK/${2:-e2e}.json" | head -1; }
# e2e_stage NAME: the loadtest against serve (SRV) on the Redis of
# use_redis, recorded as NAME (its report in WORK/NAME.json).
e2e_stage() {
  local name=$1 status t0 s0 r0 m0 t1 s1 r1 m1
  say "end to end ($name): $SHOPPERS shoppers, $STOCK items"
  # shellcheck disable=SC2086 # REDIS_PIDS is a list
  t0=$(all_ticks) s0=$(cpu_ticks "$SRV") r0=$(cpu_ticks $REDIS_PIDS) m0=$(cpu_ticks "$MARIADB_PID")
  # BENCH_E2E_PROFILE_SECONDS: a profile from the stage's start over that
  # many seconds (the whole run when longer), else 3 s from its second one.
  # The loadtest shares the cores: its own profile is NAME-loadtest.
  local lt_pprof=127.0.0.1:$(free_port)
  if [ -n "${BENCH_E2E_PROFILE_SECONDS:-}" ]; then
    profile "$name" "$BENCH_E2E_PROFILE_SECONDS" 0
    profile "$name-loadtest" "$BENCH_E2E_PROFILE_SECONDS" 0 "$lt_pprof"
  else
    profile "$name" 3
    profile "$name-loadtest" 3 1 "$lt_pprof"
  fi
  set +e
  # shellcheck disable=SC2086 # BENCH_LOADTEST_ARGS is a list of flags
  BENCH_PPROF_ADDR=$lt_pprof "$WORK/flashsale" loadtest --url "$BASE" --campaign "bench-$RUN_ID-$name" ${E2E_CAMPAIGN_FLAGS:---stock $STOCK} --shoppers "$SHOPPERS" \
    --concurrency 256 --repeat 0 --idempotent-share 0 --results ws --settle 30 --progress=false --json \
    ${BENCH_LOADTEST_ARGS:-} >"$WORK/$name.json"
  status=$?
  set -e
  [ "$status" = 0 ] || E2E_STATUS=$status
  # shellcheck disable=SC2086
  t1=$(all_ticks) s1=$(cpu_ticks "$SRV") r1=$(cpu_ticks $REDIS_PIDS) m1=$(cpu_ticks "$MARIADB_PID")
  RPS[$name]=$(json requests_per_second "$name" | awk '{printf "%.0f", $1}')
  # serve's CPU over the sale alone (the loadtest reads it from /metrics):
  # the stage's own figures also hold the settle and the re-read of every
  # success.
  SALE_CPU[$name]=$(json server_cpu_us_per_request "$name" | awk '{printf "%.0f", $1}')
  CPU[$name]=$(awk -v a="$((t1 - t0))" -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v m="$((m1 - m0))" -v n="$(json requests "$name")" -v hz="$HZ" \
    'BEGIN{if(a<1)a=1; if(n<1)n=1; printf "serve %.0f us/req + redis %.0f us/req; CPU split: serve %d%%, redis %d%%, mariadb %d%%, loadtest+rest %d%%", 1e6*s/hz/n, 1e6*r/hz/n, 100*s/a, 100*r/a, 100*m/a, 100*(a-s-r-m)/a}')
  [ -z "${SALE_CPU[$name]}" ] || CPU[$name]+="; serve during the sale alone ${SALE_CPU[$name]} us/req"
  record "$name" "$(json requests "$name")" "$((s1 - s0))" "$((r1 - r0))"
}
if want e2e; then
  e2e_stage e2e
fi

# An all-success sale decided in MySQL (degraded mode, issue 28) beside the
# bound of that design, a bare conditional UPDATE on one hot row
# (BenchmarkConditionalUpdate: 16 callers, autocommit, as many updates as
# the sale has units), and the same sale on the Redis path: each of
# BENCH_DEGRADED_ROUNDS rounds (3) runs the three, in turn. The serve has a
# Redis of its own, its queue in it too (the embedded default's shape:
# the gateway decides and answers each purchase itself): a campaign of
# BENCH_DEGRADED_STOCK units (20000) is created and preloaded, that Redis
# SIGKILLed, and the loadtest sells the campaign (--existing) to as many
# shoppers. Then the Redis starts again, empty, and the serve hands the
# campaign back before the next round.
if want degraded; then
  DSTOCK=${BENCH_DEGRADED_STOCK:-20000}
  (cd internal/sqlstore && go test -c -o "$WORK/sqlstore.test" .) || die "could not build the sqlstore benchmarks"
  DREDIS_PORT=$(free_port)
  DPORT=$(free_port)
  start_degraded_redis() {
    redis-server --port "$DREDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" --logfile redis-degraded.log &
    DREDIS=$!
    PIDS+=("$DREDIS")
    for _ in $(seq 1 50); do redis-cli -p "$DREDIS_PORT" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done
    die "the degraded stage's Redis did not start"
  }
  # metric NAME: its sum over the serve's series.
  metric() { curl -fs "http://127.0.0.1:$DPORT/metrics" | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $2} END {print s + 0}'; }
  # wait_metric NAME VALUE WHAT: until the serve's metric NAME is VALUE.
  wait_metric() {
    for _ in $(seq 1 300); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.1; done
    tail -20 "$WORK/serve-degraded.log" >&2
    die "the serve did not $3 within 30 s (metric $1: $(metric "$1"), want $2; the end of its log above)"
  }
  # sold_per_second NAME: the units sold per second from the sale's start
  # to its last result (the Redis path answers 202 at once and decides
  # after; in MySQL the answer is the decision).
  declare -A SOLD
  sold_per_second() { awk -v n="$(json successes "$1")" -v ms="$(json all_results_ms "$1")" 'BEGIN{if(ms>0) printf "%.0f", 1000*n/ms}'; }
  start_degraded_redis
  FLASHSALE_HTTP_ADDR=127.0.0.1:$DPORT FLASHSALE_REDIS_ADDR=127.0.0.1:$DREDIS_PORT FLASHSALE_DEGRADE=mysql \
    "$WORK/flashsale" serve --config "$CONFIG" >"$WORK/serve-degraded.log" 2>&1 &
  PIDS+=($!)
  DSRV=${PIDS[-1]}
  wait_http "http://127.0.0.1:$DPORT/healthz" "$DSRV"
  SAVED=("$BASE" "${SRV:-}" "$REDIS_PIDS")
  BASE=http://127.0.0.1:$DPORT SRV=$DSRV
  DEGRADED_RUNS=()
  for round in $(seq 1 "${BENCH_DEGRADED_ROUNDS:-3}"); do
    say "degraded round $round: the bare conditional UPDATE, $DSTOCK times"
    (cd internal/sqlstore && CI=true FLASHSALE_TEST_MYSQL_DSN="root@tcp(127.0.0.1:3306)/test" "$WORK/sqlstore.test" \
      -test.run '^$' -test.bench '^BenchmarkConditionalUpdate$' -test.benchtime "${DSTOCK}x") >"$WORK/bare-$round.txt" 2>&1 \
      || { cat "$WORK/bare-$round.txt" >&2; die "BenchmarkConditionalUpdate failed"; }
    RPS[bare-$round]=$(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "units/s") printf "%.0f", $i}' "$WORK/bare-$round.txt")
    REDIS_PIDS=$DREDIS SHOPPERS=$DSTOCK STOCK=$DSTOCK e2e_stage "redis-$round"
    SOLD[redis-$round]=$(sold_per_second "redis-$round")
    id=bench-$RUN_ID-degraded-$round
    campaign "$id" "$DSTOCK"
    kill -9 "$DREDIS"
    wait "$DREDIS" 2>/dev/null || true
    wait_metric flashsale_redis_up 0 "notice its Redis is gone"
    REDIS_PIDS='' SHOPPERS=$DSTOCK STOCK=$DSTOCK E2E_CAMPAIGN_FLAGS=--existing e2e_stage "degraded-$round"
    SOLD[degraded-$round]=$(sold_per_second "degraded-$round")
    DEGRADED_RUNS+=("$round")
    start_degraded_redis
    wait_metric flashsale_redis_up 1 "notice its Redis is back"
    wait_metric flashsale_degraded_campaigns 0 "hand the campaign back to Redis"
  done
  BASE=${SAVED[0]} SRV=${SAVED[1]} REDIS_PIDS=${SAVED[2]}
  kill "$DSRV"
  wait "$DSRV" 2>/dev/null || true
fi

# The same admit and e2e stages on the cluster: a gateway, then a serve of
# their own on it (on a port of their own: the first serve stops).
if [ "$CLUSTER" = 1 ] && { want admit || want e2e; }; then
  if [ -n "${SRV:-}" ]; then
    kill "$SRV"
    wait "$SRV" 2>/dev/null || true
  fi
  use_redis cluster
  PORT=$(free_port)
  export FLASHSALE_HTTP_ADDR=127.0.0.1:$PORT
  BASE=http://127.0.0.1:$PORT
  if want admit; then
    admit_stage admit-cluster
  fi
  if want e2e; then
    "$WORK/flashsale" serve --config "$CONFIG" >"$WORK/serve-cluster.log" 2>&1 &
    PIDS+=($!)
    SRV=${PIDS[-1]}
    wait_http "$BASE/healthz" "$SRV"
    e2e_stage e2e-cluster
  fi
  use_redis single
fi

# The worker with and without WAIT (redis.min_replicas_ack 0 and 1) on the
# cluster, end to end: BENCH_ACK_ROUNDS (3) rounds of the two in turn (the
# order reversed every other round), each a serve of its own.
if want ack; then
  [ "$CLUSTER" = 1 ] || die "the ack stage needs BENCH_REDIS_CLUSTER=1"
  if [ -n "${SRV:-}" ]; then
    kill "$SRV"
    wait "$SRV" 2>/dev/null || true
    SRV=
  fi
  use_redis cluster
  ACK_RUNS=()
  for round in $(seq 1 "${BENCH_ACK_ROUNDS:-3}"); do
    order="0 1"
    [ $((round % 2)) = 0 ] && order="1 0"
    for ack in $order; do
      PORT=$(free_port)
      export FLASHSALE_HTTP_ADDR=127.0.0.1:$PORT
      BASE=http://127.0.0.1:$PORT
      FLASHSALE_REDIS_MIN_REPLICAS_ACK=$ack "$WORK/flashsale" serve --config "$CONFIG" >"$WORK/serve-ack$ack-$round.log" 2>&1 &
      PIDS+=($!)
      SRV=${PIDS[-1]}
      wait_http "$BASE/healthz" "$SRV"
      e2e_stage "e2e-ack$ack-$round"
      ACK_RUNS+=("e2e-ack$ack-$round")
      kill "$SRV"
      wait "$SRV" 2>/dev/null || true
      SRV=
    done
  done
  use_redis single
fi

# deduct.lua alone, on the one Redis and on the cluster (the Go benchmark;
# nothing else runs meanwhile).
if want deduct; then
  [ "$CLUSTER" = 1 ] || die "the deduct stage needs BENCH_REDIS_CLUSTER=1"
  if [ -n "${SRV:-}" ]; then
    kill "$SRV"
    wait "$SRV" 2>/dev/null || true
  fi
  say "deduct.lua: BenchmarkDeductShards on one Redis and on the cluster, 3 times interleaved"
  : >"$WORK/deduct.txt"
  for _ in 1 2 3; do
    for v in redis cluster; do
      CI=true FLASHSALE_TEST_REDIS_ADDR=$REDIS_ADDR FLASHSALE_TEST_REDIS_CLUSTER_ADDRS=$CLUSTER_ADDRS \
        go test -run '^$' -bench "BenchmarkDeductShards/^$v\$" -benchtime "${BENCH_DEDUCT_TIME:-3s}" ./internal/store/ >>"$WORK/deduct.txt" 2>&1 \
        || { cat "$WORK/deduct.txt" >&2; die "BenchmarkDeductShards failed"; }
    done
  done
  for v in redis cluster; do
    # The median of the 3.
    DEDUCT[$v]=$(awk -v v="$v" '$1 ~ "BenchmarkDeductShards/"v"-" {for(i=1;i<NF;i++) if($(i+1)=="deductions/s") print $i}' "$WORK/deduct.txt" | sort -n | sed -n 2p)
  done
fi

ratio() { awk -v a="$1" -v b="${RPS[hello]:-0}" 'BEGIN{if(b>0) printf "%.2f", a/b; else print "n/a"}'; }
echo
echo "flashsale bench: $(nproc) cores, everything co-located; wrk -t$THREADS -c$CONNS -d$DURATION"
printf '%-34s %10s %8s  %s\n' stage "req/s" "vs gin" "notes"
want hello && printf '%-34s %10s %8s  %s\n' "bare gin hello (ceiling)" "${RPS[hello]}" "1.00" "${CPU[hello]}"
want admit && printf '%-34s %10s %8s  %s\n' "admit path (202)" "${RPS[admit]}" "$(ratio "${RPS[admit]}")" "non-2xx ${NON2XX[admit]}; ${CPU[admit]}"
want soldout && printf '%-34s %10s %8s  %s\n' "sold-out path (410)" "${RPS[soldout]}" "$(ratio "${RPS[soldout]}")" "${CPU[soldout]}"
want e2e && printf '%-34s %10s %8s  %s\n' "e2e $SHOPPERS shoppers / $STOCK items" "${RPS[e2e]}" "$(ratio "${RPS[e2e]}")" "${CPU[e2e]}"
if [ "$CLUSTER" = 1 ]; then
  want admit && printf '%-34s %10s %8s  %s\n' "admit path (202), cluster" "${RPS[admit-cluster]}" "$(ratio "${RPS[admit-cluster]}")" "non-2xx ${NON2XX[admit-cluster]}; ${CPU[admit-cluster]}"
  want e2e && printf '%-34s %10s %8s  %s\n' "e2e, cluster" "${RPS[e2e-cluster]}" "$(ratio "${RPS[e2e-cluster]}")" "${CPU[e2e-cluster]}"
  want deduct && printf '%-34s %10s %8s  %s\n' "deduct.lua deductions/s, one Redis" "${DEDUCT[redis]}" "" "BenchmarkDeductShards (median of 3, interleaved): 6 campaigns, 8 callers, batches of 128; all: $(awk '/deductions\/s/{for(i=1;i<NF;i++) if($(i+1)=="deductions/s") printf "%s ", $i}' "$WORK/deduct.txt")" &&
    printf '%-34s %10s %8s  %s\n' "deduct.lua deductions/s, cluster" "${DEDUCT[cluster]}" "" "$(awk -v a="${DEDUCT[cluster]}" -v b="${DEDUCT[redis]}" 'BEGIN{if(b>0) printf "%.2f x one Redis", a/b}')"
fi
if want degraded; then
  echo
  echo "degraded mode (issue 28): an all-success sale of $DSTOCK units to $DSTOCK shoppers, by round;"
  echo "units sold per second: bare, BenchmarkConditionalUpdate; redis and mysql, the sale's successes over the time to its last result"
  printf '  %-6s %8s %8s %8s %11s %12s\n' round "bare/s" "redis/s" "mysql/s" "mysql/bare" "mysql/redis"
  for round in "${DEGRADED_RUNS[@]}"; do
    printf '  %-6s %8s %8s %8s %11s %12s\n' "$round" "${RPS[bare-$round]}" "${SOLD[redis-$round]}" "${SOLD[degraded-$round]}" \
      "$(awk -v a="${SOLD[degraded-$round]}" -v b="${RPS[bare-$round]}" 'BEGIN{if(b>0) printf "%.2f", a/b}')" \
      "$(awk -v a="${SOLD[degraded-$round]}" -v b="${SOLD[redis-$round]}" 'BEGIN{if(b>0) printf "%.2f", a/b}')"
  done
  for round in "${DEGRADED_RUNS[@]}"; do
    echo "  round $round, CPU: redis path ${CPU[redis-$round]}"
    echo "  round $round, CPU: in MySQL   ${CPU[degraded-$round]}"
  done
fi
if want gate; then
  echo
  echo "gate (--challenge-bits $GATE_BITS), gateway CPU per admitted purchase, medians of $GATE_ROUNDS interleaved rounds:"
  echo "  fetch/off $GATE_FETCH (the GET), gate/off $GATE_GATE (GET and check), gate/fetch $GATE_VERIFY (the check: verify and spend)"
  echo "  us per admitted purchase by round: $GATE_LINE"
fi
if want ack; then
  echo
  echo "worker with WAIT, cluster, end to end ($SHOPPERS shoppers / $STOCK items), by round:"
  for run in "${ACK_RUNS[@]}"; do
    printf '  %-14s all results %6s ms, sold out at %6s ms, %s\n' "$run" "$(json all_results_ms "$run")" "$(json time_to_sell_out_ms "$run")" "${CPU[$run]}"
  done
  for round in $(seq 1 "${BENCH_ACK_ROUNDS:-3}"); do
    awk -v a="$(json all_results_ms "e2e-ack1-$round")" -v b="$(json all_results_ms "e2e-ack0-$round")" -v r="$round" \
      'BEGIN{if(b>0) printf "  round %s: all results ack1/ack0 %.2f\n", r, a/b}'
  done
fi
for run in e2e e2e-cluster; do
  [ -f "$WORK/$run.json" ] || continue
  echo
  echo "end to end, $run (loadtest --json, abridged):"
  for k in fire_seconds all_answered_ms all_results_ms time_to_sell_out_ms admitted successes results_delivered polls ok; do
    printf '  %-22s %s\n' "$k" "$(json "$k" "$run")"
  done
  sed -n '/"time_to_result_ms"/,/}/p;/"admit_latency_ms"/,/}/p' "$WORK/$run.json" | tr -d ' \n' | sed 's/}/}\n/g' | sed 's/^,//;s/^/  /'
done
if [ -n "${BENCH_PROFILE:-}" ]; then
  for pid in "${PROFILE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo
  echo "profiles in $BENCH_PROFILE: $(cd "$BENCH_PROFILE" && ls -- *.pb.gz 2>/dev/null | tr '\n' ' ')(go tool pprof -top -cum FILE)"
fi
! want admit || [ "${NON2XX[admit]}" = 0 ] || die "admit path: ${NON2XX[admit]} answers were not 2xx"
! want admit || [ "$CLUSTER" != 1 ] || [ "${NON2XX[admit-cluster]}" = 0 ] || die "admit path on the cluster: ${NON2XX[admit-cluster]} answers were not 2xx"
! want soldout || [ "${NON2XX[soldout]}" != 0 ] || die "sold-out path: no refusals, the campaign was not sold out"
[ "$E2E_STATUS" = 0 ] || die "end to end: loadtest reported violated invariants (exit $E2E_STATUS); see above"
