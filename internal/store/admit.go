package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/model"
)

// idemField is a shopper's field in the idem hash, "" when there is no key.
// A user id may hold '|' (Auth0's "auth0|…"), a key never does (the
// gateway allows [A-Za-z0-9_.:-]), so the last '|' splits a field one way
// only and two shoppers' keys never share a field.
func idemField(userID, idempotencyKey string) string {
	if idempotencyKey == "" {
		return ""
	}
	return userID + "|" + idempotencyKey
}

// fingerprint sums up what a request asks for, so that a key sent again
// with another body is told apart from a retry. The campaign and the user
// are the key's scope already (the idem hash is the campaign's, its field
// the user's); the quantity is the whole body.
func fingerprint(a model.AdmitRequest) string {
	return strconv.FormatInt(a.Quantity, 10)
}

// parseIdemValue reads an idem hash value, "<request id>|<fingerprint>" as
// admit.lua writes it (the prelude's idem_value); one without a
// fingerprint matches any (hasFP false).
func parseIdemValue(v string) (requestID, fp string, hasFP bool) {
	return strings.Cut(v, "|")
}

// Admit applies the rate limits to a batch of one campaign's requests and
// stores the admitted ones as queued, in one atomic script call. A gated
// request's challenge is checked first and spent when it admits: one that
// admitted another request before is AdmitChallengeSpent, with nothing
// changed (challenge.go). When a
// shopper's Idempotency-Key was seen before, the request changes nothing:
// with the same body its answer names the earlier request and that
// request's result as it stands, with another body it is AdmitKeyReused.
// Answers are in batch order.
func (s *Store) Admit(ctx context.Context, campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]model.AdmitReply, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	k := campaignKeys(campaignID)
	keys := []string{k.results, k.idem, k.counters, k.stock, k.campaignLimit, k.userLimits, k.ipLimits, k.meta, k.admissions}
	args, err := admitArgs(campaignID, batch, limits)
	if err != nil {
		return nil, err
	}
	for _, a := range batch {
		if a.Challenge.ID != "" {
			keys = append(keys, challengeKey(campaignID, a.Challenge.ID))
		}
	}
	reply, err := s.admit.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		if maybeNotEnqueued(err) {
			err = fmt.Errorf("%w: %w: %w", model.ErrUnavailable, model.ErrMaybeNotEnqueued, err)
		}
		return nil, fmt.Errorf("admit %s (%d requests): %w", campaignID, len(batch), err)
	}
	out, err := parseAdmitReply(batch, reply)
	if err != nil {
		return nil, fmt.Errorf("admit %s: %w", campaignID, err)
	}
	return out, nil
}

// admit.lua's ARGV, by position (1-based, as Lua counts): the head, then
// admitRequestFields values per request, then the gated requests' count and
// admitChallengeFields values per challenge, each value at its offset from
// the first of its request or challenge. admitArgs lays them out by these
// names, and admit.lua reads them by the same names (admitLayout, put
// before the script): TestAdmitLayout fails if either side counts a
// position of its own.
const (
	admitN             = 1
	admitUserRate      = 2
	admitUserBurst     = 3
	admitCampaignRate  = 4
	admitCampaignBurst = 5
	admitIPRate        = 6
	admitIPBurst       = 7
	admitHead          = 7

	admitRequestID     = 0
	admitQuantity      = 1
	admitIdemField     = 2
	admitUserID        = 3
	admitClientIP      = 4
	admitFingerprint   = 5
	admitRequestFields = 6

	admitChallengeRequest = 0 // the gated request's index in the batch, from 1
	admitChallengeExpiry  = 1
	admitChallengeHolder  = 2
	admitChallengeFields  = 3
)

// admitLayout declares admit.lua's positions for the script.
var admitLayout = luaLayout{
	{"ADMIT_N", admitN}, {"ADMIT_USER_RATE", admitUserRate}, {"ADMIT_USER_BURST", admitUserBurst},
	{"ADMIT_CAMPAIGN_RATE", admitCampaignRate}, {"ADMIT_CAMPAIGN_BURST", admitCampaignBurst},
	{"ADMIT_IP_RATE", admitIPRate}, {"ADMIT_IP_BURST", admitIPBurst}, {"ADMIT_HEAD", admitHead},
	{"ADMIT_REQUEST_ID", admitRequestID}, {"ADMIT_QUANTITY", admitQuantity}, {"ADMIT_IDEM_FIELD", admitIdemField},
	{"ADMIT_USER_ID", admitUserID}, {"ADMIT_CLIENT_IP", admitClientIP}, {"ADMIT_FINGERPRINT", admitFingerprint},
	{"ADMIT_REQUEST_FIELDS", admitRequestFields},
	{"ADMIT_CHALLENGE_REQUEST", admitChallengeRequest}, {"ADMIT_CHALLENGE_EXPIRY", admitChallengeExpiry},
	{"ADMIT_CHALLENGE_HOLDER", admitChallengeHolder}, {"ADMIT_CHALLENGE_FIELDS", admitChallengeFields},
}

// admitArgs lays out admit.lua's ARGV for a batch of campaignID; the
// challenges go in batch order, as their keys do.
func admitArgs(campaignID string, batch []model.AdmitRequest, limits model.RateLimits) ([]any, error) {
	args := make([]any, admitHead, admitHead+admitRequestFields*len(batch)+1)
	args[admitN-1], args[admitUserRate-1], args[admitUserBurst-1] = len(batch), limits.UserRate, limits.UserBurst
	args[admitCampaignRate-1], args[admitCampaignBurst-1] = limits.CampaignRate, limits.CampaignBurst
	args[admitIPRate-1], args[admitIPBurst-1] = limits.IPRate, limits.IPBurst
	gated := 0
	for _, a := range batch {
		if a.KeyTag() != campaignID {
			return nil, fmt.Errorf("admit %s: request %s belongs to %s", campaignID, a.RequestID, a.KeyTag())
		}
		var f [admitRequestFields]any
		f[admitRequestID], f[admitQuantity], f[admitIdemField] = a.RequestID, a.Quantity, idemField(a.UserID, a.IdempotencyKey)
		f[admitUserID], f[admitClientIP], f[admitFingerprint] = a.UserID, a.ClientIP, fingerprint(a)
		args = append(args, f[:]...)
		if a.Challenge.ID != "" {
			gated++
		}
	}
	args = append(args, gated)
	for i, a := range batch {
		if a.Challenge.ID != "" {
			var f [admitChallengeFields]any
			f[admitChallengeRequest] = i + 1
			f[admitChallengeExpiry], f[admitChallengeHolder] = challengeExpiry(a.Challenge.ExpiresAt), challengeHolder(a.IdempotencyKey)
			args = append(args, f[:]...)
		}
	}
	return args, nil
}

// parseAdmitReply is the one place that reads admit.lua's reply.
func parseAdmitReply(batch []model.AdmitRequest, reply []any) ([]model.AdmitReply, error) {
	if len(reply) != 2*len(batch) {
		return nil, fmt.Errorf("reply has %d elements, want %d", len(reply), 2*len(batch))
	}
	out := make([]model.AdmitReply, len(batch))
	for i, a := range batch {
		code, ok1 := reply[2*i].(int64)
		if code == 1 && ok1 {
			r, err := parseExisting(a, reply[2*i+1])
			if err != nil {
				return nil, err
			}
			out[i] = r
			continue
		}
		value, ok2 := reply[2*i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("reply for %s malformed: %v, %v", a.RequestID, reply[2*i], reply[2*i+1])
		}
		switch code {
		case 0:
			if value != a.RequestID {
				return nil, fmt.Errorf("reply for %s names %q", a.RequestID, value)
			}
			out[i] = model.AdmitReply{Code: model.Admitted, RequestID: value}
		case -1:
			out[i] = model.AdmitReply{Code: model.AdmitNotLoaded}
		case -2, -3, -4:
			secs, err := strconv.ParseFloat(value, 64)
			if err != nil || secs < 0 || math.IsNaN(secs) || math.IsInf(secs, 0) {
				return nil, fmt.Errorf("reply for %s: retry after %q", a.RequestID, value)
			}
			c := model.AdmitUserRateLimited
			switch code {
			case -3:
				c = model.AdmitCampaignRateLimited
			case -4:
				c = model.AdmitIPRateLimited
			}
			out[i] = model.AdmitReply{Code: c, RetryAfter: time.Duration(secs * float64(time.Second))}
		case -5:
			out[i] = model.AdmitReply{Code: model.AdmitKeyReused}
		case -6:
			out[i] = model.AdmitReply{Code: model.AdmitChallengeSpent}
		default:
			return nil, fmt.Errorf("reply for %s: unknown code %d", a.RequestID, code)
		}
	}
	return out, nil
}

// parseExisting reads the value of an AdmitExisting reply: the earlier
// request's id and stored result.
func parseExisting(a model.AdmitRequest, value any) (model.AdmitReply, error) {
	pair, ok := value.([]any)
	if !ok || len(pair) != 2 {
		return model.AdmitReply{}, fmt.Errorf("reply for %s: existing request malformed: %v", a.RequestID, value)
	}
	rid, ok1 := pair[0].(string)
	stored, ok2 := pair[1].(string)
	if !ok1 || !ok2 || rid == "" {
		return model.AdmitReply{}, fmt.Errorf("reply for %s: existing request without id or result: %v", a.RequestID, value)
	}
	r, err := decodeStored(rid, a.CampaignID, stored)
	if err != nil {
		return model.AdmitReply{}, fmt.Errorf("reply for %s: existing request %s: %w", a.RequestID, rid, err)
	}
	return model.AdmitReply{Code: model.AdmitExisting, RequestID: rid, Result: r}, nil
}

// IdempotentRequest answers a's Idempotency-Key as Admit would, without
// admitting anything: ok is false when the key names no request; otherwise
// the reply is AdmitExisting with the earlier request's result as it
// stands, or AdmitKeyReused when a's body differs from that request's.
// A key that names a request costs a second round trip, one that names
// nothing one.
func (s *Store) IdempotentRequest(ctx context.Context, a model.AdmitRequest) (model.AdmitReply, bool, error) {
	v, err := s.rdb.HGet(ctx, campaignKeys(a.KeyTag()).idem, idemField(a.UserID, a.IdempotencyKey)).Result()
	if errors.Is(err, redis.Nil) {
		return model.AdmitReply{}, false, nil
	}
	if err != nil {
		return model.AdmitReply{}, false, fmt.Errorf("idempotency key of %s in %s: %w: %v", a.UserID, a.CampaignID, model.ErrUnavailable, err)
	}
	rid, fp, hasFP := parseIdemValue(v)
	r, err := s.Result(ctx, rid)
	if errors.Is(err, model.ErrNotFound) {
		return model.AdmitReply{}, false, nil // names nothing, as admit.lua treats it
	}
	if err != nil {
		return model.AdmitReply{}, false, fmt.Errorf("idempotency key of %s in %s: %w", a.UserID, a.CampaignID, err)
	}
	if hasFP && fp != fingerprint(a) {
		return model.AdmitReply{Code: model.AdmitKeyReused}, true, nil
	}
	return model.AdmitReply{Code: model.AdmitExisting, RequestID: rid, Result: r}, true, nil
}
