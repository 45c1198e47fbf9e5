package model

import (
	"fmt"
	"time"
)

// Campaign limits accepted by Validate.
const (
	MaxStock      = 10_000_000
	MaxCampaignID = 64
	// MaxBuckets caps a campaign's stock buckets (Campaign.Buckets): more
	// buckets than shards buys nothing but transfers.
	MaxBuckets = 64
	// MaxChallengeBits caps a campaign's proof-of-work difficulty: 2^28
	// hashes take a browser minutes, past any sale's patience.
	MaxChallengeBits = 28
)

// Campaign is one flash sale: a fixed stock sold in a time window with a
// per-user limit.
type Campaign struct {
	ID           string
	Name         string
	Stock        int64
	PerUserLimit int64
	// Price is one unit's price in minor units (cents); 0 is free.
	Price int64
	// PaymentWindow is how long a buyer has to pay before the order
	// expires and its units go back on sale (WithDefaults fills it in).
	PaymentWindow time.Duration
	StartAt       time.Time
	EndAt         time.Time
	CreatedAt     time.Time
	// Epoch counts the campaign's loads into Redis (0: never loaded). Each
	// load starts a new one, and an order decided under an older one is
	// refused (ErrLedgerMoved): the fence between the ledger and Redis.
	Epoch Epoch
	// Paused holds the sale: the gateway refuses purchases and workers
	// hold the campaign's messages until it resumes.
	Paused bool
	// EndedEarly: an operator ended the sale before its end (EndAt is then
	// when): the workers reject the requests still queued (ReasonEndedEarly),
	// held ones of a paused sale included, rather than sell them.
	EndedEarly bool
	// ChallengeBits is the proof-of-work a purchase must carry (leading
	// zero bits of its solution's SHA-256); 0: no challenge.
	ChallengeBits int
	// DecidedInMySQL: MySQL decides the campaign's purchases, Redis being
	// unreachable (degraded mode). It is a property of the campaign in
	// MySQL, so every process agrees on who decides: a take-over sets it
	// and moves Epoch on, the next load into Redis clears it.
	DecidedInMySQL bool
	// UnitsHeld is the units of the campaign's active orders while
	// DecidedInMySQL, what MySQL decides against; otherwise stale.
	UnitsHeld int64
	// Buckets splits the stock into this many buckets, each with its own
	// hash tag, queue partition and worker (BucketTag); 0 or 1: one, the
	// campaign's own tag. Fixed at creation: a shopper's bucket is
	// BucketOf(user, Buckets), and their orders' request ids name it.
	Buckets int
}

// ValidCampaignID reports whether id may name a campaign. Campaign ids end up
// inside Redis hash tags and request ids, so the alphabet is deliberately small.
// It accepts exactly `^[A-Za-z0-9_-]{1,64}$`.
func ValidCampaignID(id string) bool {
	return allInSet(id, 1, MaxCampaignID, campaignLow, campaignHigh)
}

// Validate checks every field an admin supplies.
func (c Campaign) Validate() error {
	switch {
	case !ValidCampaignID(c.ID):
		return Invalid("id", "must match [A-Za-z0-9_-]{1,64}")
	case c.Name == "" || len(c.Name) > 200:
		return Invalid("name", "must be 1 to 200 bytes")
	case c.Stock < 1 || c.Stock > MaxStock:
		return Invalid("stock", "must be between 1 and 10000000")
	case c.PerUserLimit < 1:
		return Invalid("per_user_limit", "must be at least 1")
	case c.Price < 0 || c.Price > MaxPrice:
		return Invalid("price", "must be between 0 and 1000000000000")
	case c.PaymentWindow != 0 && (c.PaymentWindow < MinPaymentWindow || c.PaymentWindow > MaxPaymentWindow):
		return Invalid("payment_window", "must be between 1s and 24h (0 means 10m)")
	case c.PaymentWindow%time.Millisecond != 0:
		return Invalid("payment_window", "must be whole milliseconds")
	case c.ChallengeBits < 0 || c.ChallengeBits > MaxChallengeBits:
		return Invalid("challenge_bits", "must be between 0 and 28")
	case c.Buckets < 0 || c.Buckets > MaxBuckets:
		return Invalid("buckets", "must be between 1 and 64 (0 means 1)")
	case c.StartAt.IsZero():
		return Invalid("start_at", "is required")
	case c.EndAt.IsZero():
		return Invalid("end_at", "is required")
	case !c.EndAt.After(c.StartAt):
		return Invalid("end_at", "must be after start_at")
	}
	return nil
}

// CampaignState is where a campaign's sale stands at a moment.
type CampaignState string

// Campaign states; State derives them from the window and the paused flag.
const (
	StateUpcoming CampaignState = "upcoming"
	StateRunning  CampaignState = "running"
	StatePaused   CampaignState = "paused" // running, but paused
	StateEnded    CampaignState = "ended"
)

// Valid reports whether s is a known state.
func (s CampaignState) Valid() bool {
	return s == StateUpcoming || s == StateRunning || s == StatePaused || s == StateEnded
}

// State returns where the sale stands at now.
func (c Campaign) State(now time.Time) CampaignState {
	switch {
	case now.Before(c.StartAt):
		return StateUpcoming
	case !now.Before(c.EndAt):
		return StateEnded
	case c.Paused:
		return StatePaused
	}
	return StateRunning
}

// CampaignPatch is an admin's change to a campaign: nil fields stay.
type CampaignPatch struct {
	Name          *string
	PerUserLimit  *int64
	PaymentWindow *time.Duration
	StartAt       *time.Time
	EndAt         *time.Time
	ChallengeBits *int
}

// Apply returns c changed by p, validated. Before the sale starts every
// field of p may change. From its start only the name and the challenge's
// difficulty may (raising it is the operator's answer to bots arriving
// mid-sale; a solution already issued is checked at the current one): the limit and
// the window are what shoppers were admitted and decided under (a limit
// changed mid-sale would treat buyers unequally, a window moved would
// reopen or cut a sale the workers and gateways are deciding), and the
// payment window is what the orders already made were promised; ending a
// sale early is its own action (EndEarly). A change of those after the
// start is ErrSaleStarted; a patch that changes nothing is invalid.
func (c Campaign) Apply(p CampaignPatch, now time.Time) (Campaign, error) {
	if p.Name == nil && p.PerUserLimit == nil && p.PaymentWindow == nil && p.StartAt == nil && p.EndAt == nil && p.ChallengeBits == nil {
		return Campaign{}, Invalid("", "nothing to change: give name, per_user_limit, payment_window, start_at, end_at or challenge_bits")
	}
	started := !now.Before(c.StartAt) || c.EndedEarly
	if started && (p.PerUserLimit != nil || p.PaymentWindow != nil || p.StartAt != nil || p.EndAt != nil) {
		return Campaign{}, fmt.Errorf("change campaign %s: only its name may change once the sale started: %w", c.ID, ErrSaleStarted)
	}
	if p.Name != nil {
		c.Name = *p.Name
	}
	if p.PerUserLimit != nil {
		c.PerUserLimit = *p.PerUserLimit
	}
	if p.PaymentWindow != nil {
		if *p.PaymentWindow == 0 {
			return Campaign{}, Invalid("payment_window", "must be between 1s and 24h")
		}
		c.PaymentWindow = *p.PaymentWindow
	}
	if p.StartAt != nil {
		c.StartAt = *p.StartAt
	}
	if p.EndAt != nil {
		c.EndAt = *p.EndAt
	}
	if p.ChallengeBits != nil {
		c.ChallengeBits = *p.ChallengeBits
	}
	if err := c.Validate(); err != nil {
		return Campaign{}, err
	}
	return c, nil
}

// EndEarly returns c ended at now: a sale not started yet cannot end
// (ErrNotStarted: change or delete it instead); one that ended on its own
// keeps its end. Ending twice changes nothing.
func (c Campaign) EndEarly(now time.Time) (Campaign, error) {
	if now.Before(c.StartAt) {
		return Campaign{}, fmt.Errorf("end campaign %s: %w", c.ID, ErrNotStarted)
	}
	if now.Before(c.EndAt) {
		c.EndAt = now
	}
	c.EndedEarly = true
	return c, nil
}

// Window reports whether the sale is open at now.
func (c Campaign) Window(now time.Time) error {
	if now.Before(c.StartAt) {
		return ErrNotStarted
	}
	if !now.Before(c.EndAt) {
		return ErrEnded
	}
	return nil
}
