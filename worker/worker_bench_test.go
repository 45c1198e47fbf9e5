package worker

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
	"github.com/flashsale/flashsale/queue"
	"github.com/flashsale/flashsale/queue/memqueue"
	"github.com/flashsale/flashsale/queue/redisstream"
)

// benchCases are the two kinds of load: "success" sells every request (an
// order row each: the insert-heavy case); "flash_sale" sells the first 1,000
// units and answers sold_out after, the mix of a real sale.
var benchCases = []struct {
	name  string
	stock int64
}{
	{"success", model.MaxStock},
	{"flash_sale", 1000},
}

// BenchmarkHandle measures the worker's whole handler, both steps in one
// call (queue.Serial of Decide), on real Redis and
// MariaDB: decode, one deduct.lua call, the batched order INSERT and the
// results publication, per delivered batch, one batch after the other.
// deductions/s is what one partition (one campaign) can decide; the queue's
// own read and acknowledgement are not included.
func BenchmarkHandle(b *testing.B) {
	for _, tc := range benchCases {
		for _, size := range []int{128, 512} {
			b.Run(fmt.Sprintf("%s/batch=%d", tc.name, size), func(b *testing.B) {
				st, db, c := benchSetup(b, tc.stock)
				handle := queue.Serial(New(discard(), st, db, metrics.New(), Options{}).Decide)
				n := 0
				for b.Loop() {
					b.StopTimer()
					msgs := benchMessages(c, n, size)
					n += size
					b.StartTimer()
					if err := handle(b.Context(), msgs); err != nil {
						b.Fatalf("handle: %v", err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
			})
		}
	}
}

// BenchmarkRun measures the worker as it runs: consuming one campaign's
// partition through a queue driver (in memory, or Redis Streams on the same
// Redis), batches of 512, each step of one batch after the other ("serial")
// or the next batch's deduction overlapping this one's INSERT and
// publication ("pipelined"). An iteration is 40 batches published up front
// and consumed to the last Finish; publishing is outside the timer.
func BenchmarkRun(b *testing.B) {
	const size, batches = 512, 40
	drivers := []struct {
		name string
		new  func(b *testing.B) (queue.Publisher, queue.Consumer)
	}{
		{"memqueue", func(b *testing.B) (queue.Publisher, queue.Consumer) {
			q := memqueue.New(memqueue.Options{Partitions: 1, BatchSize: size})
			b.Cleanup(func() { _ = q.Close() })
			return q, q.Consumer("bench")
		}},
		{"redisstream", func(b *testing.B) (queue.Publisher, queue.Consumer) {
			q := redisstream.New(testenv.Redis(b), redisstream.Options{Partitions: 1, BatchSize: size, Block: 50 * time.Millisecond})
			b.Cleanup(func() { _ = q.Close() })
			return q, q.Consumer("bench")
		}},
	}
	for _, tc := range benchCases {
		for _, d := range drivers {
			for _, pipelined := range []bool{false, true} {
				mode := map[bool]string{false: "serial", true: "pipelined"}[pipelined]
				b.Run(fmt.Sprintf("%s/%s/%s", tc.name, d.name, mode), func(b *testing.B) {
					st, db, c := benchSetup(b, tc.stock)
					pub, cons := d.new(b)
					topic := testenv.Topic(b)
					if d.name == "redisstream" {
						rdb := testenv.Redis(b)
						b.Cleanup(func() { deleteKeys(rdb, "fsq:{"+topic+"*") })
					}
					w := New(discard(), st, db, metrics.New(), Options{})

					// The handler waits at gate, replaced per iteration, so
					// nothing is consumed while the timer is stopped.
					var gate atomic.Pointer[chan struct{}]
					var finished atomic.Int64
					allDone := make(chan struct{}, 1)
					var target atomic.Int64
					h := func(ctx context.Context, msgs []queue.Message) (queue.Finish, error) {
						<-*gate.Load()
						finish, err := w.Decide(ctx, msgs)
						if err != nil {
							return nil, err
						}
						return func(ctx context.Context) error {
							if err := finish(ctx); err != nil {
								return err
							}
							if finished.Add(int64(len(msgs))) == target.Load() {
								allDone <- struct{}{}
							}
							return nil
						}, nil
					}
					ctx, cancel := context.WithCancel(context.Background())
					stopped := make(chan error, 1)
					closed := make(chan struct{})
					gate.Store(&closed)
					go func() {
						if pipelined {
							stopped <- queue.ConsumePipelined(ctx, cons, topic, h)
						} else {
							stopped <- cons.Consume(ctx, topic, queue.Serial(h))
						}
					}()
					n := 0
					for b.Loop() {
						b.StopTimer()
						g := make(chan struct{})
						gate.Store(&g)
						msgs := benchMessages(c, n, size*batches)
						n += len(msgs)
						target.Store(int64(n))
						if err := pub.Publish(b.Context(), topic, msgs...); err != nil {
							b.Fatalf("publish: %v", err)
						}
						b.StartTimer()
						close(g)
						select {
						case <-allDone:
						case <-time.After(time.Minute):
							b.Fatalf("consumed %d of %d messages in a minute", finished.Load(), n)
						}
					}
					b.StopTimer()
					b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deductions/s")
					cancel()
					if err := <-stopped; err != nil {
						b.Errorf("consume: %v", err)
					}
				})
			}
		}
	}
}

// benchSetup creates and preloads a campaign of stock units (one per user)
// on real Redis and MariaDB.
func benchSetup(b *testing.B, stock int64) (*store.Store, *sqlstore.DB, model.Campaign) {
	rdb := testenv.Redis(b)
	st := store.New(rdb)
	db, err := sqlstore.Open(b.Context(), sqlstore.DriverMySQL, testenv.MySQLDSN(b))
	if err != nil {
		b.Fatalf("open db: %v", err)
	}
	b.Cleanup(func() { _ = db.Close() })
	c := model.Campaign{ID: testenv.Name(b, "wb-"), Name: "bench", Stock: stock, PerUserLimit: 1,
		StartAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(time.Hour)}
	if _, err := db.CreateCampaign(b.Context(), c); err != nil {
		b.Fatalf("create campaign: %v", err)
	}
	c, err = reconcile.Load(b.Context(), db, st, c.ID)
	if err != nil {
		b.Fatalf("load: %v", err)
	}
	b.Cleanup(func() { deleteKeys(rdb, "fs:{"+c.ID+"}*") })
	return st, db, c
}

// deleteKeys deletes the benchmark's keys matching pattern, one by one (they
// may live in different slots).
func deleteKeys(rdb *redis.Client, pattern string) {
	// b.Context is already cancelled when cleanups run.
	ctx := context.Background()
	keys, _ := rdb.Keys(ctx, pattern).Result()
	for _, k := range keys {
		_ = rdb.Del(ctx, k).Err()
	}
}

// benchMessages returns n purchase messages for campaign c, each from a new
// user, numbered from start. Request ids are UUIDv7s, as the gateway makes
// them: the orders' ids, derived from them, then reach MariaDB in the
// order they do in production.
func benchMessages(c model.Campaign, start, n int) []queue.Message {
	msgs := make([]queue.Message, n)
	for i := range msgs {
		seq := start + i + 1
		id := uuid.Must(uuid.NewV7())
		rid := model.FormatRequestID(c.ID, hex.EncodeToString(id[:]))
		body, _ := model.EncodePurchaseRequest(model.PurchaseRequest{RequestID: rid, CampaignID: c.ID,
			UserID: fmt.Sprintf("u%d", seq), Quantity: 1, AdmittedAt: time.Now()})
		msgs[i] = queue.Message{ID: rid, Key: c.ID, Body: body, Attempt: 1}
	}
	return msgs
}
