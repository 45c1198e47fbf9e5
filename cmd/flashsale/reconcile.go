package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/flashsale/flashsale/internal/config"
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
	fs.Usage = func() {
		fmt.Fprintln(stdout, "Usage: flashsale reconcile --config FILE --campaign ID [--repair]\n\n"+
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
	cfg, err := config.Load(*configPath, env)
	if err != nil {
		return err
	}
	if cfg.Redis.Mode == "embedded" {
		return fmt.Errorf("reconcile: needs a shared Redis and database (redis.mode server); the embedded ones live inside serve")
	}
	sys := &system{}
	defer func() {
		for i := len(sys.closers) - 1; i >= 0; i-- {
			_ = sys.closers[i]()
		}
	}()
	rdb, err := openRedis(ctx, cfg.Redis, sys)
	if err != nil {
		return err
	}
	db, err := sqlstore.Open(ctx, cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		return err
	}
	sys.closers = append(sys.closers, db.Close)
	rc := reconcile.New(store.New(rdb), db)

	if !*repair {
		rep, err := rc.Check(ctx, *campaign)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		printReport(stdout, "", rep)
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
}
