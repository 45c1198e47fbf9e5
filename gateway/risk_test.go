package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/model"
)

// farmRisk refuses the devices of a known farm and fails for one user,
// and records what it saw.
type farmRisk struct {
	mu   sync.Mutex
	seen []RiskView
}

func (f *farmRisk) Judge(_ context.Context, p RiskView) error {
	f.mu.Lock()
	f.seen = append(f.seen, p)
	f.mu.Unlock()
	switch {
	case p.DeviceID == "farm-device":
		return fmt.Errorf("device %s: %w", p.DeviceID, model.ErrRiskRefused)
	case p.UserID == "broken":
		return errors.New("the fraud service timed out")
	}
	return nil
}

// TestPurchaseRisk: the risk check sees each purchase (user, campaign,
// quantity, address, device, user agent) before anything is counted; its
// refusal is ErrRiskRefused and changes nothing (no admission, no rate
// budget spent, the Idempotency-Key free), its failure is ErrUnavailable,
// and a purchase it lets through is admitted.
func TestPurchaseRisk(t *testing.T) {
	risk := &farmRisk{}
	svc, st, c := newAdmitService(t, newGatePublisher(false), Options{Risk: risk})
	buy := func(user, device, key string) (Admitted, error) {
		return svc.Purchase(t.Context(), Purchase{UserID: user, CampaignID: c.ID, Quantity: 1, IdempotencyKey: key,
			ClientIP: "203.0.113.7", DeviceID: device, UserAgent: "bot/1.0"}, nil)
	}
	before, err := st.Stats(t.Context(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buy("mallory", "farm-device", "k1"); !errors.Is(err, model.ErrRiskRefused) {
		t.Fatalf("a farm's device: got %v, want %v", err, model.ErrRiskRefused)
	}
	if _, err := buy("broken", "", ""); !errors.Is(err, model.ErrUnavailable) {
		t.Fatalf("the check failing: got %v, want %v", err, model.ErrUnavailable)
	}
	after, err := st.Stats(t.Context(), c.ID)
	if err != nil || after.Admitted != before.Admitted {
		t.Fatalf("after the refusals: admitted %d (%v), want %d: nothing counted", after.Admitted, err, before.Admitted)
	}
	// The key the refusal carried is free: the same shopper on another
	// device buys with it.
	if adm, err := buy("mallory", "phone", "k1"); err != nil || adm.Existing {
		t.Fatalf("the same key from another device: got %+v, %v; want a new request", adm, err)
	}
	risk.mu.Lock()
	defer risk.mu.Unlock()
	want := RiskView{UserID: "mallory", CampaignID: c.ID, Quantity: 1, ClientIP: "203.0.113.7", DeviceID: "farm-device", UserAgent: "bot/1.0"}
	if len(risk.seen) != 3 || risk.seen[0] != want {
		t.Fatalf("the check saw %+v, want 3 purchases, the first %+v", risk.seen, want)
	}
}

// TestPurchaseRiskHeaders: the purchase route passes the device and user
// agent headers to the risk check (cut to 128 bytes), and its refusal is
// 403 risk_refused.
func TestPurchaseRiskHeaders(t *testing.T) {
	risk := &farmRisk{}
	svc, _, c := newAdmitService(t, newGatePublisher(false), Options{Risk: risk})
	h := NewHandlers(slog.New(slog.NewTextHandler(io.Discard, nil)), svc)
	for _, tc := range []struct {
		device string
		want   int
	}{{"farm-device", http.StatusForbidden}, {strings.Repeat("d", 200), http.StatusAccepted}} {
		w := httptest.NewRecorder()
		ctx, _ := gin.CreateTestContext(w)
		ctx.Request = httptest.NewRequest("POST", "/api/v1/campaigns/"+c.ID+"/purchases", strings.NewReader(`{"quantity":1}`))
		ctx.Request.Header.Set("Content-Type", "application/json")
		ctx.Request.Header.Set(deviceHeader, tc.device)
		ctx.Request.Header.Set("User-Agent", "shop-app/2")
		ctx.Params = gin.Params{{Key: "id", Value: c.ID}}
		h.purchase(ctx, "user-"+tc.device[:4])
		if w.Code != tc.want || (tc.want == http.StatusForbidden && !strings.Contains(w.Body.String(), `"risk_refused"`)) {
			t.Fatalf("device %.10s…: got %d %s, want %d", tc.device, w.Code, w.Body.String(), tc.want)
		}
	}
	risk.mu.Lock()
	defer risk.mu.Unlock()
	if len(risk.seen) != 2 || risk.seen[1].DeviceID != strings.Repeat("d", maxDeviceID) || risk.seen[1].UserAgent != "shop-app/2" {
		t.Fatalf("the check saw %+v, want the device cut to %d bytes and the user agent", risk.seen, maxDeviceID)
	}
}
