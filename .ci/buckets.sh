#!/usr/bin/env bash
# .ci/buckets.sh: one campaign's sale with its stock in 1, 4 and 16 buckets
# (model.Campaign.Buckets), in one run against one `flashsale serve` on the
# Redis-Streams queue, the real Redis and MariaDB, everything on this
# machine's shared cores. Each bucket count runs BUCKETS_ROUNDS times in the
# order 1,4,16,16,4,1,… so a machine that gets busier or quieter during the
# run favours none. It prints, per run, the load tool's decided requests
# per second (every purchase answered: admitted and decided, or refused),
# the deductions per second (admitted requests over the time to the last
# result: every one was decided by a worker), the time to sell out and to
# the last result, and the ratios to buckets=1.
#
# Tunables: BUCKETS_SHOPPERS (30000), BUCKETS_STOCK (3000), BUCKETS_LIST
# ("1 4 16"), BUCKETS_ROUNDS (2). Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

SHOPPERS=${BUCKETS_SHOPPERS:-30000}
STOCK=${BUCKETS_STOCK:-3000}
LIST=${BUCKETS_LIST:-1 4 16}
ROUNDS=${BUCKETS_ROUNDS:-2}

NAME=buckets
# shellcheck source=.ci/lib.sh
source .ci/lib.sh
PORT=$(free_port)
redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG || die "Redis is not answering on 127.0.0.1:6379"
mariadb -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" >/dev/null 2>&1 || die "MariaDB is not answering on 127.0.0.1:3306"

say "building"
go build -o "$WORK/flashsale" ./cmd/flashsale
mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE $DB"
export FLASHSALE_HTTP_ADDR=127.0.0.1:$PORT
export FLASHSALE_REDIS_ADDR=127.0.0.1:6379
export FLASHSALE_DATABASE_DSN="root@tcp(127.0.0.1:3306)/$DB"
export FLASHSALE_AUTH_JWT_SECRET=bench-jwt-secret-0123456789abcdef0123456789
export FLASHSALE_AUTH_ADMIN_TOKEN=bench-admin-token
export FLASHSALE_PAYMENT_WEBHOOK_SECRET=bench-webhook-secret-0123456789abcdef0123
export FLASHSALE_QUEUE_TOPIC=$TOPIC FLASHSALE_QUEUE_EXPIRY_TOPIC=$TOPIC-expiry FLASHSALE_QUEUE_DRIVER=redisstream FLASHSALE_LOG_LEVEL=warn
export FLASHSALE_GATEWAY_USER_RATE=1000000 FLASHSALE_GATEWAY_USER_BURST=1000000
export FLASHSALE_GATEWAY_IP_RATE=1000000 FLASHSALE_GATEWAY_IP_BURST=1000000
export FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP=1000000
BASE=http://127.0.0.1:$PORT

"$WORK/flashsale" serve --config configs/production.yaml >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  kill -0 "${PIDS[-1]}" 2>/dev/null || die "serve exited (log: $WORK/serve.log)"
  curl -fs -o /dev/null "$BASE/healthz" && break
  sleep 0.1
done

order=()
for ((r = 0; r < ROUNDS; r++)); do
  if ((r % 2 == 0)); then for b in $LIST; do order+=("$b"); done
  else for b in $(echo "$LIST" | tr ' ' '\n' | tac); do order+=("$b"); done; fi
done
json() { sed -n "s/^  \"$1\": \\([^,]*\\),\\{0,1\\}\$/\\1/p" "$2" | head -1; }
declare -A RPS DPS N
i=0
printf '%-8s %10s %12s %12s %14s %6s\n' buckets "req/s" "deducted/s" "sold out ms" "all results ms" ok
for b in "${order[@]}"; do
  i=$((i + 1))
  out=$WORK/run-$i.json
  set +e
  "$WORK/flashsale" loadtest --url "$BASE" --campaign "$NAME-$RUN_ID-$i" --stock "$STOCK" --shoppers "$SHOPPERS" \
    --buckets "$b" --concurrency 256 --repeat 0 --idempotent-share 0 --results ws --settle 30 --progress=false --json >"$out"
  status=$?
  set -e
  rps=$(json requests_per_second "$out")
  dps=$(awk -v a="$(json admitted "$out")" -v ms="$(json all_results_ms "$out")" 'BEGIN{printf "%.0f", (ms > 0 ? a * 1000 / ms : 0)}')
  printf '%-8s %10.0f %12s %12s %14s %6s\n' "$b" "$rps" "$dps" "$(json time_to_sell_out_ms "$out")" "$(json all_results_ms "$out")" \
    "$([ "$status" = 0 ] && echo yes || echo NO)"
  RPS[$b]=$(awk -v a="${RPS[$b]:-0}" -v r="$rps" 'BEGIN{print a + r}')
  DPS[$b]=$(awk -v a="${DPS[$b]:-0}" -v r="$dps" 'BEGIN{print a + r}')
  N[$b]=$((${N[$b]:-0} + 1))
done
base=$(awk -v s="${RPS[1]:-0}" -v n="${N[1]:-1}" 'BEGIN{print s / n}')
dbase=$(awk -v s="${DPS[1]:-0}" -v n="${N[1]:-1}" 'BEGIN{print s / n}')
for b in $LIST; do
  awk -v b="$b" -v s="${RPS[$b]}" -v d="${DPS[$b]}" -v n="${N[$b]}" -v base="$base" -v dbase="$dbase" \
    'BEGIN{printf "buckets=%-3s mean %.0f req/s (%.2f), %.0f deducted/s (%.2f) of buckets=1\n", b, s / n, (base > 0 ? s / n / base : 0), d / n, (dbase > 0 ? d / n / dbase : 0)}'
done
