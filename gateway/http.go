package gateway

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/model"
)

// Handlers are the gateway's HTTP endpoints: bind, call the service, respond.
type Handlers struct {
	log *slog.Logger
	svc *Service
}

// NewHandlers returns the HTTP layer over svc.
func NewHandlers(log *slog.Logger, svc *Service) *Handlers { return &Handlers{log: log, svc: svc} }

// RegisterAdmin mounts the admin API; admin is the admin-token middleware.
func (h *Handlers) RegisterAdmin(r gin.IRouter, admin gin.HandlerFunc) {
	g := r.Group("/admin/v1", admin)
	g.POST("/campaigns", h.createCampaign)
	g.GET("/campaigns", h.listCampaigns)
	g.GET("/campaigns/:id", h.getCampaign)
	g.PATCH("/campaigns/:id", h.patchCampaign)
	g.DELETE("/campaigns/:id", h.deleteCampaign)
	g.POST("/campaigns/:id/end", h.endCampaign)
	g.POST("/campaigns/:id/preload", h.preload)
	g.GET("/campaigns/:id/stats", h.stats)
	h.registerLedger(g)
}

// RegisterShopper mounts the shopper API; shopper wraps a handler in the JWT
// check (httpapi.Shopper).
func (h *Handlers) RegisterShopper(r gin.IRouter, shopper func(httpapi.ShopperHandler) gin.HandlerFunc) {
	r.GET("/api/v1/campaigns", h.openCampaigns)
	r.GET("/api/v1/campaigns/:id", h.publicCampaign)
	r.POST(purchasePath, shopper(h.purchase))
	r.GET(challengePath, shopper(h.challenge))
}

type campaignRequest struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Stock        int64  `json:"stock"`
	PerUserLimit int64  `json:"per_user_limit"`
	// Price is one unit's price in minor units (cents).
	Price int64 `json:"price"`
	// PaymentWindow is a Go duration ("10m", "90s"); empty is the default.
	PaymentWindow string    `json:"payment_window"`
	StartAt       time.Time `json:"start_at"`
	EndAt         time.Time `json:"end_at"`
	ChallengeBits int       `json:"challenge_bits"`
	// Buckets splits the stock (model.Campaign.Buckets); 0 or absent: 1.
	Buckets int `json:"buckets"`
}

func (r campaignRequest) toModel() (model.Campaign, error) {
	var window time.Duration
	if r.PaymentWindow != "" {
		var err error
		if window, err = time.ParseDuration(r.PaymentWindow); err != nil {
			return model.Campaign{}, model.Invalid("payment_window", `must be a duration such as "10m" or "90s"`)
		}
	}
	return model.Campaign{ID: r.ID, Name: r.Name, Stock: r.Stock, PerUserLimit: r.PerUserLimit, Price: r.Price,
		PaymentWindow: window, StartAt: r.StartAt, EndAt: r.EndAt, ChallengeBits: r.ChallengeBits, Buckets: r.Buckets}, nil
}

type campaignResponse struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Stock         int64     `json:"stock"`
	PerUserLimit  int64     `json:"per_user_limit"`
	Price         int64     `json:"price"`
	PaymentWindow string    `json:"payment_window"`
	StartAt       time.Time `json:"start_at"`
	EndAt         time.Time `json:"end_at"`
	CreatedAt     time.Time `json:"created_at"`
	ChallengeBits int       `json:"challenge_bits"`
	Buckets       int       `json:"buckets"`
}

func toCampaignResponse(c model.Campaign) campaignResponse {
	return campaignResponse{ID: c.ID, Name: c.Name, Stock: c.Stock, PerUserLimit: c.PerUserLimit, Price: c.Price,
		PaymentWindow: c.PaymentWindow.String(), StartAt: c.StartAt, EndAt: c.EndAt, CreatedAt: c.CreatedAt,
		ChallengeBits: c.ChallengeBits, Buckets: max(c.Buckets, 1)}
}

func (h *Handlers) createCampaign(c *gin.Context) {
	var req campaignRequest
	if err := httpapi.DecodeJSON(c, &req); err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	campaign, err := req.toModel()
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	httpapi.AuditCampaign(c, campaign.ID)
	created, err := h.svc.CreateCampaign(c.Request.Context(), campaign)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusCreated, toCampaignResponse(created))
}

func (h *Handlers) preload(c *gin.Context) {
	force := false
	switch c.Query("force") {
	case "", "false", "0":
	case "true", "1":
		force = true
	default:
		httpapi.Abort(c, h.log, model.Invalid("force", "must be true or false"))
		return
	}
	out, err := h.svc.Preload(c.Request.Context(), c.Param("id"), force)
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"campaign_id": c.Param("id"), "outcome": out})
}

type statsResponse struct {
	Stock            int64                  `json:"stock"`
	Remaining        int64                  `json:"remaining"`
	Sold             int64                  `json:"sold"`
	SoldOut          bool                   `json:"sold_out"`
	Preloaded        bool                   `json:"preloaded"`
	Admitted         int64                  `json:"admitted"`
	Queued           int64                  `json:"queued"`
	Lost             int64                  `json:"lost"`
	FinishedByStatus map[model.Status]int64 `json:"finished_by_status"`
	OrdersInDB       int64                  `json:"orders_in_db"`
	UnitsInDB        int64                  `json:"units_in_db"`
	// DecidedIn is where the counts come from: "redis", or "mysql" while
	// Redis is out and MySQL decides the campaign (degraded mode).
	DecidedIn string `json:"decided_in"`
}

func (h *Handlers) stats(c *gin.Context) {
	st, err := h.svc.Stats(c.Request.Context(), c.Param("id"))
	if err != nil {
		httpapi.Abort(c, h.log, err)
		return
	}
	c.JSON(http.StatusOK, toStatsResponse(st))
}
