package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/model"
)

// The gate against bots in a load test: with --challenge-bits N the
// campaign is created gated, and each purchase first fetches a challenge
// (GET …/challenge), solves it with the Go solver and sends the solution
// in the Flashsale-Challenge header, as the shopper page does with
// pow.js. --challenge-fetch fetches one before each purchase of a campaign
// that is not gated and sends nothing: the GET's cost without the check,
// for an A/B of the gate's two costs (docs/BENCHMARKS.md, issue 17).

// challengeOptions are the gate's flags.
type challengeOptions struct {
	bits  int
	fetch bool
}

func (c *challengeOptions) register(fs *flag.FlagSet) {
	fs.IntVar(&c.bits, "challenge-bits", 0, fmt.Sprintf("the campaign's proof-of-work difficulty (0-%d; 0: not gated): each purchase fetches a challenge, solves it and sends it", model.MaxChallengeBits))
	fs.BoolVar(&c.fetch, "challenge-fetch", false, "with --challenge-bits 0: fetch a challenge before each purchase anyway and send nothing (the GET's cost alone)")
}

func (c challengeOptions) validate() error {
	switch {
	case c.bits < 0 || c.bits > model.MaxChallengeBits:
		return fmt.Errorf("--challenge-bits: must be between 0 and %d", model.MaxChallengeBits)
	case c.fetch && c.bits > 0:
		return fmt.Errorf("--challenge-fetch: goes with --challenge-bits 0 (a gated campaign fetches anyway)")
	}
	return nil
}

// on reports whether each purchase fetches a challenge first.
func (c challengeOptions) on() bool { return c.bits > 0 || c.fetch }

// shopperChallenge is the solution a shopper sent with its last keyed
// purchase: a replay of that purchase resends it, as a retrying client
// would; any other purchase needs a challenge of its own.
type shopperChallenge struct {
	key, solution string
}

// challengeAnswer is the gateway's answer to GET …/challenge.
type challengeAnswer struct {
	Challenge string `json:"challenge"`
	Bits      int    `json:"bits"`
	Code      string `json:"code"`
}

// challengeFor returns the Flashsale-Challenge header of s's next purchase
// with Idempotency-Key key ("" when there is none to send). When the
// challenge cannot be had, refused is the answer to record for the
// purchase instead (err for a transport failure).
func (lt *loadtest) challengeFor(ctx context.Context, s *shopper, key string) (header string, refused *purchaseAnswer, err error) {
	if !lt.o.challenge.on() {
		return "", nil, nil
	}
	if key != "" && s.challenge.key == key && s.challenge.solution != "" {
		return s.challenge.solution, nil, nil
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(lt.o.url + "/api/v1/campaigns/" + lt.o.campaign + "/challenge")
	req.Header.Set("Authorization", "Bearer "+s.token)
	if err := lt.shopperCall(ctx, lt.shoppers, routeChallenge, req, resp); err != nil {
		return "", nil, fmt.Errorf("challenge: %w", err)
	}
	var ch challengeAnswer
	if jerr := json.Unmarshal(resp.Body(), &ch); jerr != nil || (resp.StatusCode() == http.StatusOK && ch.Challenge == "") {
		ch.Code = "challenge_malformed"
	}
	if resp.StatusCode() != http.StatusOK || ch.Code != "" {
		return "", &purchaseAnswer{status: resp.StatusCode(), code: "challenge:" + ch.Code}, nil
	}
	if lt.o.challenge.bits == 0 {
		return "", nil, nil
	}
	sol, err := challenge.Solve(ctx, ch.Challenge, ch.Bits)
	if err != nil {
		return "", nil, err
	}
	s.challenge = shopperChallenge{key: key, solution: sol}
	return sol, nil, nil
}

// challengeHeader sets req's Flashsale-Challenge for s's purchase with key;
// ok false means the purchase is not sent, its answer recorded (latency
// from due).
func (lt *loadtest) challengeHeader(ctx context.Context, s *shopper, key string, req *fasthttp.Request, due time.Time) (purchaseAnswer, bool) {
	header, refused, err := lt.challengeFor(ctx, s, key)
	switch {
	case err != nil:
		a := purchaseAnswer{code: "transport"}
		lt.rec.answer(a, time.Since(due), err)
		return a, false
	case refused != nil:
		lt.rec.answer(*refused, time.Since(due), nil)
		return *refused, false
	}
	if header != "" {
		req.Header.Set("Flashsale-Challenge", header)
	}
	return purchaseAnswer{}, true
}
