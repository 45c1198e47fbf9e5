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
#
# Not part of .ci/run. Tunables: BENCH_DURATION (10s), BENCH_CONNECTIONS (128),
# BENCH_THREADS (1: wrk keeps at most one core), BENCH_SHOPPERS (100000),
# BENCH_STOCK (1000), BENCH_STAGES (hello,admit,soldout,e2e: the stages to
# run; ratios need hello), BENCH_LOADTEST_ARGS (flags added to the e2e
# loadtest, which win over its own: '--results poll' for the WebSocket/poll
# A/B of the server's CPU per purchase, '--ws-per-shopper' for a crowd, whose
# CPU per request then includes its connects and the wait after it leaves). Settings of flashsale pass through the
# environment, e.g. FLASHSALE_GATEWAY_ADMIT_LINGER=0 for an A/B. BENCH_PROFILE=DIR also writes a CPU profile of the server
# during each stage to DIR/<stage>.pb.gz (`go tool pprof -top -cum FILE`;
# BENCH_E2E_PROFILE_SECONDS=N: e2e's over its first N seconds, not 3 from 1):
# the binaries then get net/http/pprof through `go build -overlay` from a file
# made in the run's temporary folder, so nothing in the tree imports it.
# Profiling costs the server a few per cent; compare profiled runs only with
# profiled runs.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10s}
CONNS=${BENCH_CONNECTIONS:-128}
THREADS=${BENCH_THREADS:-1}
SHOPPERS=${BENCH_SHOPPERS:-100000}
STOCK=${BENCH_STOCK:-1000}
STAGES=${BENCH_STAGES:-hello,admit,soldout,e2e}
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
go build "${BUILD_FLAGS[@]}" -o "$WORK/flashsale" ./cmd/flashsale
go build "${BUILD_FLAGS[@]}" -o "$WORK/hello" ./.ci/benchhello
mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE $DB"

export FLASHSALE_HTTP_ADDR=127.0.0.1:$PORT
export FLASHSALE_REDIS_ADDR=$REDIS_ADDR
export FLASHSALE_DATABASE_DSN="root@tcp(127.0.0.1:3306)/$DB"
export FLASHSALE_AUTH_JWT_SECRET=bench-jwt-secret-0123456789abcdef0123456789
export FLASHSALE_AUTH_ADMIN_TOKEN=bench-admin-token
export FLASHSALE_PAYMENT_WEBHOOK_SECRET=bench-webhook-secret-0123456789abcdef0123
export FLASHSALE_QUEUE_TOPIC=$TOPIC
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
CONFIG=configs/production.yaml
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
REDIS_PID=$(pgrep -o -x redis-server || true)
MARIADB_PID=$(pgrep -o -x mariadbd || true)

# profile NAME SECONDS [DELAY]: with BENCH_PROFILE, a CPU profile of the
# server in the background, starting DELAY seconds (1) into the stage.
profile() {
  [ -n "${BENCH_PROFILE:-}" ] || return 0
  (sleep "${3:-1}"; curl -fs -o "$BENCH_PROFILE/$1.pb.gz" "http://$PPROF_ADDR/debug/pprof/profile?seconds=$2" \
    || say "no profile for $1") &
  PROFILE_PIDS+=($!)
}
PROFILE_PIDS=()
PROFILE_SECONDS=5 # within the stage: wrk's duration less the first and last second
if [[ $DURATION =~ ^([0-9]+)s$ ]] && [ "${BASH_REMATCH[1]}" -gt 3 ]; then PROFILE_SECONDS=$((BASH_REMATCH[1] - 2)); fi

# load NAME URL_PATH SERVER_PID: wrk against the path; prints req/s and the
# CPU split of the run, and records the non-2xx count.
declare -A RPS NON2XX CPU
load() {
  local name=$1 path=$2 server=$3 out t0 s0 r0 m0 t1 s1 r1 m1
  t0=$(all_ticks) s0=$(cpu_ticks "$server") r0=$(cpu_ticks "$REDIS_PID") m0=$(cpu_ticks "$MARIADB_PID")
  profile "$name" "$PROFILE_SECONDS"
  out=$(BENCH_PATH=$path wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s "$WORK/purchase.lua" "http://127.0.0.1:$4")
  t1=$(all_ticks) s1=$(cpu_ticks "$server") r1=$(cpu_ticks "$REDIS_PID") m1=$(cpu_ticks "$MARIADB_PID")
  RPS[$name]=$(awk '/^Requests\/sec:/{printf "%.0f", $2}' <<<"$out")
  NON2XX[$name]=$(awk '/Non-2xx or 3xx responses:/{print $5}' <<<"$out")
  NON2XX[$name]=${NON2XX[$name]:-0}
  local all=$((t1 - t0)) srv=$((s1 - s0)) red=$((r1 - r0)) mdb=$((m1 - m0)) reqs
  reqs=$(awk '/requests in/{print $1}' <<<"$out")
  # CPU time per request is steadier than req/s when something else runs.
  CPU[$name]=$(awk -v a="$all" -v s="$srv" -v r="$red" -v m="$mdb" -v n="$reqs" -v hz="$HZ" \
    'BEGIN{if(a<1)a=1; if(n<1)n=1; printf "server %.0f us/req + redis %.0f us/req; CPU split: server %d%%, redis %d%%, mariadb %d%%, wrk+rest %d%%", 1e6*s/hz/n, 1e6*r/hz/n, 100*s/a, 100*r/a, 100*m/a, 100*(a-s-r-m)/a}')
  say "$name: ${RPS[$name]} req/s (non-2xx ${NON2XX[$name]}; ${CPU[$name]})"
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
if want admit; then
  FLASHSALE_QUEUE_TOPIC=$TOPIC-admit "$WORK/flashsale" gateway --config "$CONFIG" >"$WORK/gateway.log" 2>&1 &
  PIDS+=($!)
  GW=${PIDS[-1]}
  wait_http "$BASE/healthz" "$GW"
  ACC=bench-$RUN_ID-admit
  campaign "$ACC" 10000000
  redis-cli -h 127.0.0.1 config resetstat >/dev/null
  load admit "/api/v1/campaigns/$ACC/purchases" "$GW" "$PORT"
  CALLS=$(redis-cli -h 127.0.0.1 info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
  BATCH=$(awk -v n="$(awk '/requests in/{print $1}' "$WORK/wrk-admit.txt")" -v c="${CALLS:-0}" 'BEGIN{if(c>0) printf "%.1f", n/c; else print "?"}')
  CPU[admit]="${CPU[admit]}; $BATCH purchases per admit.lua call"
  kill "$GW"
  wait "$GW" 2>/dev/null || true
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
if want e2e; then
  say "end to end: $SHOPPERS shoppers, $STOCK items"
  E2E=bench-$RUN_ID-e2e
  t0=$(all_ticks) s0=$(cpu_ticks "$SRV") r0=$(cpu_ticks "$REDIS_PID") m0=$(cpu_ticks "$MARIADB_PID")
  # BENCH_E2E_PROFILE_SECONDS: a profile from the stage's start over that
  # many seconds (the whole run when longer), else 3 s from its second one.
  if [ -n "${BENCH_E2E_PROFILE_SECONDS:-}" ]; then profile e2e "$BENCH_E2E_PROFILE_SECONDS" 0; else profile e2e 3; fi
  set +e
  "$WORK/flashsale" loadtest --url "$BASE" --campaign "$E2E" --stock "$STOCK" --shoppers "$SHOPPERS" \
    --concurrency 256 --repeat 0 --idempotent-share 0 --results ws --settle 30 --progress=false --json \
    ${BENCH_LOADTEST_ARGS:-} >"$WORK/e2e.json"
  E2E_STATUS=$?
  set -e
  t1=$(all_ticks) s1=$(cpu_ticks "$SRV") r1=$(cpu_ticks "$REDIS_PID") m1=$(cpu_ticks "$MARIADB_PID")
  json() { sed -n "s/^  \"$1\": \\([^,]*\\),\\{0,1\\}\$/\\1/p" "$WORK/e2e.json" | head -1; }
  RPS[e2e]=$(json requests_per_second | awk '{printf "%.0f", $1}')
  CPU[e2e]=$(awk -v a="$((t1 - t0))" -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v m="$((m1 - m0))" -v n="$(json requests)" -v hz="$HZ" \
    'BEGIN{if(a<1)a=1; if(n<1)n=1; printf "serve %.0f us/req + redis %.0f us/req; CPU split: serve %d%%, redis %d%%, mariadb %d%%, loadtest+rest %d%%", 1e6*s/hz/n, 1e6*r/hz/n, 100*s/a, 100*r/a, 100*m/a, 100*(a-s-r-m)/a}')
fi

ratio() { awk -v a="$1" -v b="${RPS[hello]:-0}" 'BEGIN{if(b>0) printf "%.2f", a/b; else print "n/a"}'; }
echo
echo "flashsale bench: $(nproc) cores, everything co-located; wrk -t$THREADS -c$CONNS -d$DURATION"
printf '%-34s %10s %8s  %s\n' stage "req/s" "vs gin" "notes"
want hello && printf '%-34s %10s %8s  %s\n' "bare gin hello (ceiling)" "${RPS[hello]}" "1.00" "${CPU[hello]}"
want admit && printf '%-34s %10s %8s  %s\n' "admit path (202)" "${RPS[admit]}" "$(ratio "${RPS[admit]}")" "non-2xx ${NON2XX[admit]}; ${CPU[admit]}"
want soldout && printf '%-34s %10s %8s  %s\n' "sold-out path (410)" "${RPS[soldout]}" "$(ratio "${RPS[soldout]}")" "${CPU[soldout]}"
want e2e && printf '%-34s %10s %8s  %s\n' "e2e $SHOPPERS shoppers / $STOCK items" "${RPS[e2e]}" "$(ratio "${RPS[e2e]}")" "${CPU[e2e]}"
if want e2e; then
  echo
  echo "end to end (loadtest --json, abridged):"
  for k in fire_seconds all_answered_ms all_results_ms time_to_sell_out_ms admitted successes results_delivered polls ok; do
    printf '  %-22s %s\n' "$k" "$(json "$k")"
  done
  sed -n '/"time_to_result_ms"/,/}/p;/"admit_latency_ms"/,/}/p' "$WORK/e2e.json" | tr -d ' \n' | sed 's/}/}\n/g' | sed 's/^,//;s/^/  /'
fi
if [ -n "${BENCH_PROFILE:-}" ]; then
  for pid in "${PROFILE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo
  echo "profiles in $BENCH_PROFILE: $(cd "$BENCH_PROFILE" && ls -- *.pb.gz 2>/dev/null | tr '\n' ' ')(go tool pprof -top -cum FILE)"
fi
! want admit || [ "${NON2XX[admit]}" = 0 ] || die "admit path: ${NON2XX[admit]} answers were not 2xx"
! want soldout || [ "${NON2XX[soldout]}" != 0 ] || die "sold-out path: no refusals, the campaign was not sold out"
[ "$E2E_STATUS" = 0 ] || die "end to end: loadtest reported violated invariants (exit $E2E_STATUS); see above"
