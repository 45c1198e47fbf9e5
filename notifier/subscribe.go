package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flashsale/flashsale/internal/wire"
	"github.com/flashsale/flashsale/model"
)

// The WebSocket protocol, in JSON text frames:
//
//	client: {"type":"subscribe","request_ids":["<id>", ...]}
//	server: {"type":"error","code":"not_found"|"too_many_subscriptions"|"rate_limited"|"unavailable","request_id":"<id>","message":"...","retry_after"?:<seconds>}
//	        one per refused id, then
//	        {"type":"subscribed","request_ids":[<subscribed ids, in request order>]}
//	server: {"type":"result","result":{"request_id":...,"campaign_id":...,"status":...,"quantity":...,"order_id"?,"reason"?}}
//	        once per subscription, when its request is final; the subscription ends
//	server: {"type":"error","code":"invalid_request","message":"..."} for a bad frame;
//	        the user's maxInvalidFrames-th bad frame (across its connections)
//	        closes the connection (1008)

// Error codes of the WebSocket protocol's error frames.
const (
	codeNotFound    = "not_found"
	codeTooMany     = "too_many_subscriptions"
	codeInvalid     = "invalid_request"
	codeRateLimited = "rate_limited"
	codeUnavailable = "unavailable"

	msgNotFound = "no such purchase request"
)

// clientFrame is the only frame clients send.
type clientFrame struct {
	Type       string   `json:"type"`
	RequestIDs []string `json:"request_ids"`
}

type subscribedFrame struct {
	Type       string   `json:"type"`
	RequestIDs []string `json:"request_ids"`
}

type errorFrame struct {
	Type      string `json:"type"`
	Code      string `json:"code"`
	RequestID string `json:"request_id,omitempty"`
	Message   string `json:"message,omitempty"`
	// RetryAfter is in seconds, as the HTTP header, for rate_limited.
	RetryAfter int `json:"retry_after,omitempty"`
}

type resultFrame struct {
	Type   string     `json:"type"`
	Result resultBody `json:"result"`
}

// encodeFrame marshals one of the frame types above, which cannot fail.
func encodeFrame(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("notifier: encode %T: %v", v, err))
	}
	return b
}

func idError(code, requestID, message string) []byte {
	return encodeFrame(errorFrame{Type: "error", Code: code, RequestID: requestID, Message: message})
}

// parseSubscribe returns the distinct request ids of a subscribe frame, in
// order, or an error that is safe to show the client.
func parseSubscribe(typ int, data []byte) ([]string, error) {
	if typ != websocket.TextMessage {
		return nil, errors.New("only text frames are accepted")
	}
	if ids, ok := parseCanonicalSubscribe(data); ok {
		return distinctIDs(ids)
	}
	return parseSubscribeJSON(data)
}

// parseSubscribeJSON is parseSubscribe's full path, for any spelling.
func parseSubscribeJSON(data []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f clientFrame
	if err := dec.Decode(&f); err != nil {
		return nil, errors.New(`frame must be a JSON object {"type":"subscribe","request_ids":[...]}`)
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON object")
	}
	// encoding/json takes {"Request_IDs":…} and repeated keys: refuse them
	// as every JSON body is refused.
	if err := wire.CheckKeys(data, reflect.TypeFor[clientFrame]()); err != nil {
		return nil, fmt.Errorf("frame: %v", err)
	}
	if f.Type != "subscribe" {
		return nil, errors.New(`type must be "subscribe"`)
	}
	return distinctIDs(f.RequestIDs)
}

// subscribeSpellings frame the subscribe frame's ids as clients write it:
// flashsale.js in field order, Go's encoding of a map (the load tool) in
// key order.
var subscribeSpellings = [...]struct{ prefix, suffix []byte }{
	{[]byte(`{"type":"subscribe","request_ids":[`), []byte(`]}`)},
	{[]byte(`{"request_ids":[`), []byte(`],"type":"subscribe"}`)},
}

// parseCanonicalSubscribe reads a subscribe frame written exactly as one of
// subscribeSpellings around ids quoted without escapes and joined by
// commas: what encoding/json would decode the same way, without its
// reflection (a socket per purchase parses one such frame each). Any other
// spelling reports false and takes the full path.
func parseCanonicalSubscribe(data []byte) ([]string, bool) {
	data = bytes.TrimSuffix(data, []byte("\n")) // json.Encoder's, as gorilla's WriteJSON sends it
	var rest []byte
	for _, sp := range subscribeSpellings {
		if len(data) >= len(sp.prefix)+len(sp.suffix) && bytes.HasPrefix(data, sp.prefix) && bytes.HasSuffix(data, sp.suffix) {
			rest = data[len(sp.prefix) : len(data)-len(sp.suffix)]
			break
		}
	}
	if len(rest) == 0 {
		return nil, false // empty: the full path says why
	}
	ids := make([]string, 0, 1+bytes.Count(rest, []byte(",")))
	for {
		if len(rest) < 2 || rest[0] != '"' {
			return nil, false
		}
		end := 1
		for end < len(rest) && rest[end] != '"' {
			if c := rest[end]; c < 0x20 || c == '\\' || c >= 0x7f {
				return nil, false
			}
			end++
		}
		if end == len(rest) {
			return nil, false
		}
		ids = append(ids, string(rest[1:end]))
		rest = rest[end+1:]
		if len(rest) == 0 {
			return ids, true
		}
		if rest[0] != ',' {
			return nil, false
		}
		rest = rest[1:]
	}
}

// distinctIDs checks a frame's request ids and drops repeats, keeping the
// first of each in order.
func distinctIDs(requestIDs []string) ([]string, error) {
	if len(requestIDs) == 0 {
		return nil, errors.New("request_ids must not be empty")
	}
	seen := make(map[string]bool, len(requestIDs))
	ids := requestIDs[:0]
	for _, id := range requestIDs {
		if id == "" {
			return nil, errors.New("request_ids must not contain empty strings")
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// subscribe answers one subscribe frame. Each subscription is registered in
// the hub, and its campaign's results channel subscribed to, before its
// stored result is read, so a result that lands between the two is either
// seen by the read or published to the (pending) subscription; the hub's
// states make sure it is sent once.
func (n *Notifier) subscribe(c *conn, ids []string) {
	refused := map[string][]byte{}
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := model.CampaignOfRequest(id); ok {
			valid = append(valid, id)
		} else {
			refused[id] = idError(codeNotFound, id, msgNotFound)
		}
	}
	added, existing, over := n.hub.add(c, valid, n.opts.MaxSubscriptionsPerConn)
	for _, id := range over {
		refused[id] = idError(codeTooMany, id, fmt.Sprintf("at most %d subscriptions per connection", n.opts.MaxSubscriptionsPerConn))
	}
	// Each new subscription costs a Redis read: the user's budget decides
	// how many are made; the rest are given up before any read.
	if len(added) > 0 {
		now := n.opts.now()
		granted, wait := n.subscribes.take(c.userID, len(added), now)
		if granted > 0 {
			var ipWait time.Duration
			if granted, ipWait = n.subscribesPerIP.take(c.ip, granted, now); ipWait > wait {
				wait = ipWait
			}
		}
		for _, s := range added[granted:] {
			n.hub.cancel(s)
			refused[s.requestID] = encodeFrame(errorFrame{Type: "error", Code: codeRateLimited, RequestID: s.requestID,
				Message: "too many subscriptions per second; subscribe again later", RetryAfter: retryAfterSeconds(wait)})
		}
		added = added[:granted]
	}
	subscribed := map[string]bool{}
	for _, id := range existing {
		subscribed[id] = true
	}
	type checked struct {
		s *subscription
		r model.Result
	}
	var verified []checked
	if len(added) > 0 && c.stopping() {
		for _, s := range added {
			n.hub.cancel(s)
		}
		added = nil
	}
	if len(added) > 0 {
		// One read for the whole frame.
		ids := make([]string, len(added))
		for i, s := range added {
			ids[i] = s.requestID
		}
		// Subscribe to the campaigns' results before reading them: a
		// result published meanwhile is in the read or reaches the hub.
		fctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		n.feeds.ensure(fctx, ids)
		cancel()
		results, err := n.lookups.results(ids)
		switch {
		case err == nil:
			users := make([]string, len(ids))
			for i := range users {
				users[i] = c.userID
			}
			n.fillUnstored(users, ids, results)
		case errors.Is(err, model.ErrUnavailable) && n.opts.Ledger != nil:
			var lerr error
			if results, lerr = n.decidedOrWaiting(c.userID, ids); lerr != nil {
				err = fmt.Errorf("%w; %w", err, lerr)
			} else {
				err = nil
			}
		}
		if err != nil {
			n.log.Error("read stored results", "user_id", c.userID, "requests", len(ids), "err", err)
		}
		for i, s := range added {
			switch {
			case err != nil || results[i].Status == statusUnavailable:
				n.hub.cancel(s)
				refused[s.requestID] = idError(codeUnavailable, s.requestID, "could not read the result; subscribe again")
			case results[i].Status == "" || results[i].UserID != c.userID:
				// Unknown and other users' ids look the same, so ids
				// cannot be probed.
				n.hub.cancel(s)
				refused[s.requestID] = idError(codeNotFound, s.requestID, msgNotFound)
			default:
				verified = append(verified, checked{s, results[i]})
				subscribed[s.requestID] = true
			}
		}
	}

	// Refusals, then the acknowledgement, then results. The acknowledgement
	// is queued before any subscription turns active, so no result of this
	// frame can overtake it.
	ack := subscribedFrame{Type: "subscribed", RequestIDs: []string{}}
	for _, id := range ids {
		if f, ok := refused[id]; ok {
			n.push(c, outMsg{data: f}, n.opts.WriteTimeout)
		} else if subscribed[id] {
			ack.RequestIDs = append(ack.RequestIDs, id)
		}
	}
	n.push(c, outMsg{data: encodeFrame(ack)}, n.opts.WriteTimeout)
	now := time.Now()
	for _, v := range verified {
		if r, ok := n.hub.activate(v.s, v.r, now); ok {
			data := encodeFrame(resultFrame{Type: "result", Result: toResultBody(r)})
			n.push(c, outMsg{data: data, result: true}, n.opts.WriteTimeout)
		}
	}
}

// decidedOrWaiting reads a subscribe frame's ids, for userID, while Redis
// is unavailable: the results MySQL decided, and for the others a
// placeholder that waits (queued, userID's, no sequence number), since they
// may still be decided in MySQL or in Redis. A placeholder proves no
// ownership and is never sent: the result that ends the request is handed
// to its own user only, and the other waiters are told not_found
// (hub.publish, reread).
func (n *Notifier) decidedOrWaiting(userID string, ids []string) ([]model.Result, error) {
	ctx, cancel := context.WithTimeout(n.life, storeTimeout)
	defer cancel()
	found, err := n.decided(ctx, ids)
	if err != nil {
		return nil, err
	}
	results := make([]model.Result, len(ids))
	for i, id := range ids {
		if r, ok := found[id]; ok {
			results[i] = r
			continue
		}
		campaign, _ := model.CampaignOfRequest(id)
		results[i] = model.Result{RequestID: id, CampaignID: campaign, UserID: userID, Status: model.StatusQueued}
	}
	return results, nil
}

// statusUnavailable marks, in fillUnstored's results, a request whose
// answer could not be read; never a status of model's.
const statusUnavailable model.Status = "-unavailable"

// fillUnstored puts, at the places of results that Redis had nothing for,
// what unstored answers users[i] (what MySQL decided, rejected lost, or
// queued while the queue has not passed the request), so a subscription
// to a request whose state died waits for its end rather than being
// refused. A place whose user is "" is left alone, as is a request
// unstored does not know; one it could not read gets statusUnavailable.
// One ledger read serves every place, and one deadline bounds the reads.
func (n *Notifier) fillUnstored(users, ids []string, results []model.Result) {
	if n.opts.Ledger == nil {
		return
	}
	var missing []string
	for i, r := range results {
		if r.Status == "" && users[i] != "" {
			missing = append(missing, ids[i])
		}
	}
	if len(missing) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(n.life, storeTimeout)
	defer cancel()
	found, err := n.decided(ctx, missing)
	if err != nil {
		n.log.Warn("read requests Redis has no result for", "requests", len(missing), "err", err)
	}
	for i, r := range results {
		if r.Status != "" || users[i] == "" {
			continue
		}
		if err != nil {
			results[i].Status = statusUnavailable
			continue
		}
		if got, ok := found[ids[i]]; ok {
			results[i] = got
			continue
		}
		got, lerr := n.lostRule(ctx, users[i], ids[i])
		switch {
		case lerr == nil:
			results[i] = got
		case !errors.Is(lerr, model.ErrNotFound):
			n.log.Warn("read a request Redis has no result for", "request_id", ids[i], "user_id", users[i], "err", lerr)
			results[i].Status = statusUnavailable
		}
	}
}
