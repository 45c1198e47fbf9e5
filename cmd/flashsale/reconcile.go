package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/metrics"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
)

func runReconcile(ctx context.Context, args []string, stdout io.Writer, env map[string]string) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stdout)
	configPath := fs.String("config", "", "config file naming the real Redis and MySQL")
	campaign := fs.String("campaign", "", "campaign id (required)")
	repair := fs.Bool("repair", false, "once the sale has ended or is paused: restore missing orders and rebuild Redis from MySQL")
	metricsFile := fs.String("metrics-file", "", "also write the outcome (differences by kind) in Prometheus's text format to this file, for node_exporter's textfile collector")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "Usage: flashsale reconcile --config FILE --campaign ID [--repair] [--metrics-file FILE]\n\n"+
			"Compares a campaign's sales in Redis (remaining, sold, per-user units, results) with its orders\n"+
			"in MySQL and prints every difference; exits non-zero when they disagree.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *campaign == "" {
		fs.Usage()
		return fmt.Errorf("reconcile: --campaign is required")
	}
	rc, closeAll, err := openReconciler(ctx, "reconcile", *configPath, env)
	if err != nil {
		return err
	}
	defer closeAll()

	if !*repair {
		rep, err := rc.Check(ctx, *campaign)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		printReport(stdout, "", rep)
		if err := writeReconcileMetrics(*metricsFile, rep); err != nil {
			return err
		}
		if !rep.Consistent() {
			return fmt.Errorf("reconcile: %d differences", len(rep.Differences))
		}
		return nil
	}
	before, after, err := rc.Repair(ctx, *campaign)
	printReport(stdout, "before repair: ", before)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	printReport(stdout, "after repair: ", after)
	if err := writeReconcileMetrics(*metricsFile, after); err != nil {
		return err
	}
	if !after.Consistent() {
		return fmt.Errorf("reconcile: %d differences remain after repair", len(after.Differences))
	}
	return nil
}

func printReport(w io.Writer, prefix string, r reconcile.Report) {
	fmt.Fprintf(w, "%scampaign %s: stock %d, Redis sold %d, MySQL %d orders / %d units, %d differences\n",
		prefix, r.CampaignID, r.Stock, r.RedisSold, r.DBOrders, r.DBUnits, len(r.Differences))
	for _, d := range r.Differences {
		fmt.Fprintf(w, "  %-18s %s\n", d.Kind, d.Detail)
	}
	if len(r.Lost) > 0 {
		// Not differences: final results, counted for the operator.
		const listed = 20
		fmt.Fprintf(w, "  %d requests lost with Redis, ended rejected (lost): %s", len(r.Lost), strings.Join(r.Lost[:min(len(r.Lost), listed)], " "))
		if len(r.Lost) > listed {
			fmt.Fprintf(w, " and %d more", len(r.Lost)-listed)
		}
		fmt.Fprintln(w)
	}
}

// writeReconcileMetrics writes r's differences by kind to path (nothing
// when path is empty), replacing the file in one rename so the textfile
// collector never reads half of it.
func writeReconcileMetrics(path string, r reconcile.Report) error {
	if path == "" {
		return nil
	}
	found := map[string]int{}
	for _, d := range r.Differences {
		found[d.Kind]++
	}
	m := metrics.NewReconcile()
	m.Record(r.CampaignID, reconcile.Kinds(), found, time.Now())
	if err := prometheus.WriteToTextfile(path, m.Registry); err != nil {
		return fmt.Errorf("reconcile: metrics file: %w", err)
	}
	return nil
}

// openReconciler loads the config of a one-shot command (reconcile,
// archive) and opens the shared Redis and database it works on; release
// lets them go.
func openReconciler(ctx context.Context, command, configPath string, env map[string]string) (rc *reconcile.Reconciler, release func(), err error) {
	cfg, err := config.Load(configPath, env)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Redis.Mode == "embedded" {
		return nil, nil, fmt.Errorf("%s: needs a shared Redis and database (redis.mode server or cluster); the embedded ones live inside serve", command)
	}
	sys := &system{}
	release = func() {
		for i := len(sys.closers) - 1; i >= 0; i-- {
			_ = sys.closers[i]()
		}
	}
	rdb, err := openRedis(ctx, cfg.Redis, sys)
	if err != nil {
		release()
		return nil, nil, err
	}
	db, err := sqlstore.Open(ctx, cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		release()
		return nil, nil, err
	}
	sys.closers = append(sys.closers, db.Close)
	return reconcile.New(store.New(rdb, store.WithKeyRetention(cfg.Redis.KeyRetention)), db), release, nil
}
