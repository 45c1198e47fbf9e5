package model

import "time"

// RateLimits are the per-second limits a purchase is admitted under; a zero
// rate turns a limit off, a burst below 1 counts as 1. They are declared once,
// here: the tags name the gateway's configuration keys and environment
// variables (gateway.user_rate, FLASHSALE_GATEWAY_USER_RATE, …).
type RateLimits struct {
	UserRate      int `yaml:"user_rate" env:"USER_RATE"`
	UserBurst     int `yaml:"user_burst" env:"USER_BURST"`
	CampaignRate  int `yaml:"campaign_rate" env:"CAMPAIGN_RATE"`
	CampaignBurst int `yaml:"campaign_burst" env:"CAMPAIGN_BURST"`
	// IPRate limits each client IP per campaign, so one address cannot drive
	// many accounts at full speed.
	IPRate  int `yaml:"ip_rate" env:"IP_RATE"`
	IPBurst int `yaml:"ip_burst" env:"IP_BURST"`
}

// PerBucket returns the limits one bucket of a campaign of n buckets
// admits under. Each bucket keeps its own rate-limit state (its keys carry
// its tag), so the campaign-wide limit is split: n buckets together admit
// no more than the setting (at least 1 per second each, so a rate below n
// admits up to n). The per-user limit stays whole (a shopper always
// reaches one bucket); so does the per-IP one, since one address's
// shoppers may all share a bucket: an address driving accounts in every
// bucket gets up to n times its rate.
func (l RateLimits) PerBucket(n int) RateLimits {
	if n <= 1 {
		return l
	}
	split := func(v int) int {
		if v <= 0 {
			return v
		}
		return max(1, v/n)
	}
	l.CampaignRate, l.CampaignBurst = split(l.CampaignRate), split(l.CampaignBurst)
	return l
}

// AdmitRequest is one purchase request to admit: rate-limit, deduplicate by
// its Idempotency-Key and store as queued.
type AdmitRequest struct {
	RequestID  string
	CampaignID string
	// Tag is the shopper's bucket's tag in a campaign of several
	// (model.UserTag); "" in one of one: KeyTag is then CampaignID.
	Tag            string
	UserID         string
	Quantity       int64
	IdempotencyKey string // optional
	// ClientIP is rate-limited when RateLimits.IPRate is set; "" is not.
	ClientIP string
	// Challenge is the verified challenge of a gated campaign's purchase
	// (zero when not gated): admitting spends it, and it admits once.
	Challenge ChallengePass
}

// AdmitCode is what admitting did with one request.
type AdmitCode int

// Admit outcomes, one per request.
const (
	// Admitted: stored as queued; the caller must publish it (or withdraw it).
	Admitted AdmitCode = iota
	// AdmitExisting: the shopper's Idempotency-Key names an earlier request
	// with the same body.
	AdmitExisting
	// AdmitNotLoaded: the campaign has no stock in Redis.
	AdmitNotLoaded
	// AdmitUserRateLimited and AdmitCampaignRateLimited: refused by a limit.
	AdmitUserRateLimited
	AdmitCampaignRateLimited
	// AdmitIPRateLimited: refused by the per-client-IP limit.
	AdmitIPRateLimited
	// AdmitKeyReused: the shopper's Idempotency-Key names an earlier
	// request with another body (ErrIdempotencyKeyReused).
	AdmitKeyReused
	// AdmitChallengeSpent: the request's challenge admitted another
	// request before (ErrChallengeFailed).
	AdmitChallengeSpent
)

// AdmitReply is the answer for one AdmitRequest.
type AdmitReply struct {
	Code AdmitCode
	// RequestID is the request's own id, or the earlier one for AdmitExisting.
	RequestID string
	// Result is, for AdmitExisting, the earlier request's result as it
	// stands now: queued, or final once a worker decided it.
	Result Result
	// RetryAfter is set for the rate-limited codes.
	RetryAfter time.Duration
}

// KeyTag returns the tag the request's keys and queue partition live
// under: its bucket's, or its campaign's.
func (a AdmitRequest) KeyTag() string {
	if a.Tag != "" {
		return a.Tag
	}
	return a.CampaignID
}
