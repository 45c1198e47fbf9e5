#!/usr/bin/env bash
# .ci/wscrowd.sh: what a waiting crowd costs the notifier (issue 16, target 1):
# RSS per idle *subscribed* WebSocket at several crowd sizes, the memory
# given back once the crowd leaves, and the CPU the notifier spends while the
# crowd waits idle. For each N in WSCROWD_SIZES:
#   1. fresh `flashsale gateway` and `flashsale notifier` processes on free
#      ports (real Redis and MariaDB, the Redis-Streams queue) and NO worker;
#   2. `flashsale loadtest --ws-per-shopper`: N shoppers connect within
#      WSCROWD_WINDOW (a herd), each buys one unit and subscribes its request
#      id on its socket. With no worker every purchase stays queued, so every
#      socket waits on a real pending request while the crowd holds, idle,
#      for WSCROWD_HOLD;
#   3. once the tool says the hold is over, a `flashsale worker` starts and
#      decides the queue; the results arrive, the crowd leaves, and the tool
#      reads the notifier until its memory settles (at most 30 s), checking
#      every invariant of the sale as usual.
# A paused campaign cannot stand in for the missing worker: the gateway
# refuses a paused sale's purchases (409 paused), and only those admitted
# before the pause would be held.
#
# The tool and the notifier are separate processes, each with its own
# open-file limit (one descriptor per socket on each side).
# Not part of .ci/run. Tunables: WSCROWD_SIZES (5000,10000,15000),
# WSCROWD_HOLD (30s), WSCROWD_WINDOW (1s), WSCROWD_STOCK (1000). Settings of
# flashsale pass through the environment (FLASHSALE_NOTIFIER_...).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${WSCROWD_SIZES:-5000,10000,15000}
HOLD=${WSCROWD_HOLD:-30s}
WINDOW=${WSCROWD_WINDOW:-1s}
STOCK=${WSCROWD_STOCK:-1000}
REDIS_ADDR=127.0.0.1:6379

NAME=wscrowd
# shellcheck source=.ci/lib.sh
source .ci/lib.sh

redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG || die "Redis is not answering on $REDIS_ADDR (bash .ci/run starts it)"
mariadb -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" >/dev/null 2>&1 || die "MariaDB is not answering on 127.0.0.1:3306 (bash .ci/run starts it)"
if ! command -v jq >/dev/null; then
  say "installing jq"
  { apt-get update -qq && apt-get install -y -qq jq; } >/dev/null || die "could not install jq (apt-get install jq)"
fi
largest=$(tr ',' '\n' <<<"$SIZES" | sort -n | tail -1)
[ "$(ulimit -n)" -gt $((largest + 1000)) ] || die "open-file limit $(ulimit -n) is too low for $largest sockets (ulimit -n)"

# WORK, PIDS, RUN_ID, DB, TOPIC and the clean-up come from .ci/lib.sh.

say "building"
go build -o "$WORK/flashsale" ./cmd/flashsale
mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE $DB"

export FLASHSALE_REDIS_ADDR=$REDIS_ADDR
export FLASHSALE_DATABASE_DSN="root@tcp(127.0.0.1:3306)/$DB"
export FLASHSALE_AUTH_JWT_SECRET=wscrowd-jwt-secret-0123456789abcdef0123456789
export FLASHSALE_AUTH_ADMIN_TOKEN=wscrowd-admin-token
export FLASHSALE_PAYMENT_WEBHOOK_SECRET=wscrowd-webhook-secret-0123456789abcdef0123
export FLASHSALE_QUEUE_TOPIC=$TOPIC FLASHSALE_QUEUE_EXPIRY_TOPIC=$TOPIC-expiry
export FLASHSALE_HTTP_DRAIN_DELAY=0
export FLASHSALE_QUEUE_DRIVER=redisstream
export FLASHSALE_LOG_LEVEL=warn
# Every shopper comes from this host: the per-address limits would refuse
# the crowd; the process's WebSocket cap is raised to the descriptors left.
export FLASHSALE_GATEWAY_IP_RATE=${FLASHSALE_GATEWAY_IP_RATE:-1000000} FLASHSALE_GATEWAY_IP_BURST=${FLASHSALE_GATEWAY_IP_BURST:-1000000}
export FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=${FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP:-1000000}
export FLASHSALE_NOTIFIER_MAX_CONNS=${FLASHSALE_NOTIFIER_MAX_CONNS:-$(($(ulimit -n) - 512))}
CONFIG=configs/production.yaml

# start ROLE PORT: a role on its own port; its pid goes to STARTED.
start() {
  FLASHSALE_HTTP_ADDR=127.0.0.1:$2 "$WORK/flashsale" "$1" --config "$CONFIG" >"$WORK/$1-$2.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
}
# wait_http URL PID: URL answers, and PID (which was to bind it) still runs.
wait_http() {
  for _ in $(seq 1 100); do
    kill -0 "$2" 2>/dev/null || die "process $2 exited before $1 answered: $(tail -5 "$WORK"/*.log)"
    curl -fs -o /dev/null "$1" && return 0
    sleep 0.1
  done
  die "$1 did not answer"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

say "machine: $(nproc) cores; load before the run: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the CPU figures)"
ROWS=()
for N in ${SIZES//,/ }; do
  GP=$(free_port) NP=$(free_port) WP=$(free_port)
  start gateway "$GP"
  GW=$STARTED
  start notifier "$NP"
  NTF=$STARTED
  wait_http "http://127.0.0.1:$GP/healthz" "$GW"
  wait_http "http://127.0.0.1:$NP/healthz" "$NTF"
  say "$N shoppers: gateway :$GP, notifier :$NP (pid $NTF), no worker until the hold is over"
  "$WORK/flashsale" loadtest --url "http://127.0.0.1:$GP" --results-url "http://127.0.0.1:$NP" \
    --campaign "wscrowd-$RUN_ID-$N" --shoppers "$N" --stock "$STOCK" --repeat 0 --idempotent-share 0 \
    --ws-per-shopper --connect-window "$WINDOW" --hold "$HOLD" --settle 60 --json \
    >"$WORK/crowd-$N.json" 2>"$WORK/loadtest-$N.log" &
  LT=$!
  PIDS+=("$LT")
  while kill -0 "$LT" 2>/dev/null && ! grep -q "hold over" "$WORK/loadtest-$N.log"; do sleep 0.2; done
  start worker "$WP"
  WK=$STARTED
  status=0
  wait "$LT" || status=$?
  [ -s "$WORK/crowd-$N.json" ] || die "loadtest with $N shoppers wrote no report (exit $status): $(grep -v '^shoppers answered' "$WORK/loadtest-$N.log" | tail -5)"
  jq -r '.crowd | "connected \(.connected), refused 429 \(.connect_failed["429"]) 503 \(.connect_failed["503"]) other \(.connect_failed.other), connect p50 \(.connect_time_ms.p50) ms p99 \(.connect_time_ms.p99) ms max \(.connect_time_ms.max) ms, sale started \(.sale_start_lag_ms) ms after the window, reconnects \(.reconnects)"' "$WORK/crowd-$N.json" | sed 's/^/wscrowd:   /' >&2
  [ "$status" = 0 ] || die "loadtest with $N shoppers failed (exit $status): $(jq -c '[.invariants[] | select(.ok | not)]' "$WORK/crowd-$N.json")"
  ROWS+=("$(jq -r --arg n "$N" '.crowd.notifier as $x | [$n, $x.websocket_clients_connected, $x.websocket_subscriptions_connected,
      ($x.rss_before_bytes / 1048576 | floor), ($x.rss_connected_bytes / 1048576 | floor),
      (if $x.bytes_per_connection then ($x.bytes_per_connection / 1024 * 10 | round / 10) else "n/a" end),
      ($x.rss_after_leave_bytes / 1048576 | floor), ($x.after_leave_wait_ms / 1000 | round),
      (if $x.idle_cpu_seconds then ($x.idle_cpu_seconds * 100 | round / 100) else "n/a" end)] | @tsv' "$WORK/crowd-$N.json")")
  for pid in "$LT" "$WK" "$NTF" "$GW"; do stop "$pid"; done
  PIDS=()
done

echo
echo "flashsale wscrowd: $(nproc) cores, everything co-located; hold $HOLD, connect window $WINDOW; every socket subscribed to a queued request"
printf '%7s %8s %6s %11s %14s %13s %16s %7s %11s\n' N clients subs "RSS before" "RSS connected" "KiB per conn" "RSS after leave" "after" "idle CPU s"
for row in "${ROWS[@]}"; do
  IFS=$'\t' read -r n clients subs before connected per after wait cpu <<<"$row"
  printf '%7s %8s %6s %8s MiB %10s MiB %13s %12s MiB %6ss %11s\n' "$n" "$clients" "$subs" "$before" "$connected" "$per" "$after" "$wait" "$cpu"
done
