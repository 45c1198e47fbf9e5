package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// TestReconcileMetricsFile: `flashsale reconcile --metrics-file` writes
// every kind of difference for the campaign, zero on a clean sale, and
// oversold once MySQL holds more active units than the stock (an order
// inserted behind the sale's back): what the oversell alert in
// deploy/prometheus/alerts.yml watches.
func TestReconcileMetricsFile(t *testing.T) {
	cfg := realConfig(t, "memqueue")
	c := startSystem(t, cfg)
	campaign := testenv.Name(t, "recon-m-")
	c.openCampaign(campaign, 1, 1)
	if code := c.do("POST", "/api/v1/campaigns/"+campaign+"/purchases", c.token("ann"), `{"quantity":1}`, nil, nil); code != http.StatusAccepted {
		t.Fatalf("purchase: got %d", code)
	}
	c.settle(campaign, 10*time.Second)
	env := commandEnv(cfg)
	path := filepath.Join(t.TempDir(), "flashsale_reconcile.prom")
	reconcile := func() (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), []string{"reconcile", "--campaign", campaign, "--metrics-file", path}, &out, env, logTo(io.Discard))
		return out.String(), err
	}
	sample := func(kind string) string {
		return `flashsale_reconcile_differences{campaign="` + campaign + `",kind="` + kind + `"} `
	}
	written := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("metrics file: %v", err)
		}
		return string(b)
	}

	if out, err := reconcile(); err != nil {
		t.Fatalf("clean sale: got %v\n%s", err, out)
	}
	clean := written()
	for _, kind := range []string{"oversold", "over_limit", "sold_mismatch"} {
		if !strings.Contains(clean, sample(kind)+"0\n") {
			t.Errorf("clean sale: no %s0 in\n%s", sample(kind), clean)
		}
	}
	if !strings.Contains(clean, `flashsale_reconcile_last_run_timestamp_seconds{campaign="`+campaign+`"} `) {
		t.Errorf("clean sale: no last run time in\n%s", clean)
	}

	// An order the sale never decided, stored under the current epoch.
	db, err := sqlstore.Open(t.Context(), cfg.Database.Driver, cfg.Database.DSN)
	if err != nil {
		t.Fatalf("open db: %v", err)
	}
	defer db.Close()
	camp, err := db.Campaign(t.Context(), campaign)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	extra := model.Order{ID: uuid.NewString(), RequestID: model.FormatRequestID(campaign, strings.Repeat("ab", 16)),
		CampaignID: campaign, UserID: "mallory", Quantity: 1, Status: model.OrderPendingPayment, ExpiresAt: time.Now().Add(time.Hour)}
	if err := db.InsertOrders(t.Context(), []model.Order{extra}, model.Epochs{campaign: camp.Epoch}); err != nil {
		t.Fatalf("insert the extra order: %v", err)
	}
	if out, err := reconcile(); err == nil || !strings.Contains(out, "oversold") {
		t.Fatalf("oversold sale: got %v\n%s\nwant a failure naming oversold", err, out)
	}
	if got := written(); !strings.Contains(got, sample("oversold")+"1\n") {
		t.Errorf("oversold sale: no %s1 in\n%s", sample("oversold"), got)
	}
}
