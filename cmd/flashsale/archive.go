package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

func runArchive(ctx context.Context, args []string, stdout io.Writer, env map[string]string) error {
	fs := flag.NewFlagSet("archive", flag.ContinueOnError)
	fs.SetOutput(stdout)
	configPath := fs.String("config", "", "config file naming the real Redis and MySQL")
	campaign := fs.String("campaign", "", "campaign id (required)")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "Usage: flashsale archive --config FILE --campaign ID\n\n"+
			"Removes a campaign's keys from Redis once its sale has ended, no order is pending payment\n"+
			"and Redis agrees with MySQL (as `flashsale reconcile` checks); refuses, changing nothing,\n"+
			"otherwise. MySQL keeps the campaign and its orders. Without it the keys expire on their own\n"+
			"(redis.key_retention after the end and payment window).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *campaign == "" {
		fs.Usage()
		return fmt.Errorf("archive: --campaign is required")
	}
	rc, closeAll, err := openReconciler(ctx, "archive", *configPath, env)
	if err != nil {
		return err
	}
	defer closeAll()
	rep, removed, err := rc.Archive(ctx, *campaign)
	if rep.CampaignID != "" {
		printReport(stdout, "", rep)
	}
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	fmt.Fprintf(stdout, "campaign %s archived: %d Redis keys removed\n", *campaign, removed)
	return nil
}
