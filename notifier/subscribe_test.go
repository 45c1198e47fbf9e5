package notifier

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestWSSubscribeOneRead: the new subscriptions of a frame cost one
// stored-result round trip whatever their outcomes, and the frames keep
// their order: refusals in request order, the acknowledgement, then results.
func TestWSSubscribeOneRead(t *testing.T) {
	t.Parallel()
	for _, impl := range envs {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			e := impl.make(t)
			h := newHarness(t, e.src, Options{RecheckInterval: time.Hour})
			queued, final := e.newRequest(t, "alice"), e.newRequest(t, "alice")
			e.decide(t, final, "alice")
			bobs, unknown := e.newRequest(t, "bob"), newRequestID(t, e.campaign)
			later := e.newRequest(t, "alice")
			ws := mustDial(t, h, "alice")
			steps := []struct {
				name      string
				ids       []string
				want      []string // frames, as frameSummary writes them
				wantTrips int64
			}{
				{
					name: "every outcome in one frame",
					ids:  []string{queued, bobs, final, unknown, "nope"},
					want: []string{"error not_found " + bobs, "error not_found " + unknown, "error not_found nope",
						fmt.Sprintf("subscribed %v", []string{queued, final}), "result " + final + " success"},
					wantTrips: 1,
				},
				{
					name:      "only ids already subscribed: no read",
					ids:       []string{queued},
					want:      []string{fmt.Sprintf("subscribed %v", []string{queued})},
					wantTrips: 0,
				},
				{
					name:      "an id already subscribed and a new one",
					ids:       []string{queued, later},
					want:      []string{fmt.Sprintf("subscribed %v", []string{queued, later})},
					wantTrips: 1,
				},
			}
			for _, st := range steps {
				t.Run(st.name, func(t *testing.T) {
					before := e.trips()
					mustSend(t, ws, websocket.TextMessage, subscribeFrame(st.ids...))
					var got []string
					for range st.want {
						got = append(got, frameSummary(t, mustRead(t, ws)))
					}
					if !slices.Equal(got, st.want) {
						t.Errorf("got frames %q, want %q", got, st.want)
					}
					if n := e.trips() - before; n != st.wantTrips {
						t.Errorf("got %d stored-result round trips, want %d", n, st.wantTrips)
					}
				})
			}
			r := e.decide(t, queued, "alice")
			e.publish(t, r)
			checkResult(t, mustReadResult(t, ws), r)
		})
	}
}

// TestWSSubscribeReadFails: when the one read of a frame fails, every new
// subscription of the frame is refused as unavailable and given up, and the
// ids already subscribed stay.
func TestWSSubscribeReadFails(t *testing.T) {
	t.Parallel()
	e, f := fakeEnv(t)
	h := newHarness(t, f, Options{RecheckInterval: time.Hour})
	held, a, b := e.newRequest(t, "alice"), e.newRequest(t, "alice"), e.newRequest(t, "alice")
	ws := mustDial(t, h, "alice")
	if subscribed, _ := mustSubscribe(t, ws, held); !slices.Equal(subscribed, []string{held}) {
		t.Fatalf("got subscribed %v, want [%s]", subscribed, held)
	}
	f.setFail(errors.New("redis down"))
	subscribed, errs := mustSubscribe(t, ws, a, held, b)
	var refused []string
	for _, fr := range errs {
		refused = append(refused, fr.Code+" "+fr.RequestID)
	}
	if want := []string{"unavailable " + a, "unavailable " + b}; !slices.Equal(refused, want) || !slices.Equal(subscribed, []string{held}) {
		t.Errorf("got refused %v and subscribed %v, want %v and [%s]", refused, subscribed, want, held)
	}
	if got := h.n.hub.size(); got != 1 {
		t.Errorf("got %d request ids in the hub, want 1", got)
	}
}

// frameSummary writes a server frame as "error <code> <id>", "subscribed
// [ids]" or "result <id> <status>".
func frameSummary(t *testing.T, f wsFrame) string {
	t.Helper()
	switch f.Type {
	case "error":
		return "error " + f.Code + " " + f.RequestID
	case "subscribed":
		return fmt.Sprintf("subscribed %v", f.RequestIDs)
	case "result":
		var r wsResult
		if err := json.Unmarshal(f.Result, &r); err != nil {
			t.Fatalf("result %s: %v", f.Result, err)
		}
		return "result " + r.RequestID + " " + r.Status
	}
	return "unexpected " + f.Type
}

// FuzzCanonicalSubscribe: whatever the fast path accepts, the full JSON path
// reads the same way, ids and errors alike.
func FuzzCanonicalSubscribe(f *testing.F) {
	for _, s := range []string{
		`{"type":"subscribe","request_ids":["c1.0123456789abcdef0123456789abcdef"]}`,
		`{"type":"subscribe","request_ids":["a","b","a"]}`,
		`{"type":"subscribe","request_ids":[""]}`,
		`{"type":"subscribe","request_ids":[]}`,
		`{"type":"subscribe","request_ids":["a",]}`,
		`{"type":"subscribe","request_ids":["a""b"]}`,
		`{"type":"subscribe","request_ids":["a\"b"]}`,
		`{"type":"subscribe","request_ids":["a\u0062"]}`,
		`{"type":"subscribe","request_ids":["é"]}`,
		`{"type":"subscribe","request_ids":["a"],"x":1}`,
		`{"type":"subscribe","request_ids":["a"]}]}`,
		`{"type":"subscribe","request_ids":[1]}`,
		`{"type": "subscribe","request_ids":["a"]}`,
		`{"request_ids":["a","b"],"type":"subscribe"}`,
		"{\"request_ids\":[\"a\"],\"type\":\"subscribe\"}\n",
		"{\"request_ids\":[\"a\"],\"type\":\"subscribe\"}\n\n",
		"{\"type\":\"subscribe\",\"request_ids\":[\"a\"]}\n",
		`{"request_ids":[],"type":"subscribe"}`,
		`{"request_ids":["a"],"type":"subscribe"}],"type":"subscribe"}`,
		`{"request_ids":["],"type":"subscribe"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := parseCanonicalSubscribe(data)
		if !ok {
			return
		}
		want, wantErr := parseSubscribeJSON(data)
		got, gotErr := distinctIDs(fast)
		if (gotErr == nil) != (wantErr == nil) || !slices.Equal(got, want) {
			t.Errorf("%q: got %q, %v; want %q, %v", data, got, gotErr, want, wantErr)
		}
	})
}

// TestCanonicalSubscribeClients: the fast path takes the frames real
// clients send: flashsale.js's JSON.stringify (field order), and Go's
// encoding of a map (key order) as gorilla's WriteJSON sends it (with
// json.Encoder's newline), which the load tool writes.
func TestCanonicalSubscribeClients(t *testing.T) {
	t.Parallel()
	ids := []string{"c1.0123456789abcdef0123456789abcdef", "c1.fedcba9876543210fedcba9876543210"}
	mapFrame, _ := json.Marshal(map[string]any{"type": "subscribe", "request_ids": ids})
	tests := []struct {
		name string
		data string
	}{
		{"flashsale.js", `{"type":"subscribe","request_ids":["` + ids[0] + `","` + ids[1] + `"]}`},
		{"a Go map", string(mapFrame)},
		{"a Go map through WriteJSON", string(mapFrame) + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseCanonicalSubscribe([]byte(tt.data))
			if !ok || !slices.Equal(got, ids) {
				t.Errorf("%s: got %q, %v; want %q, true", tt.data, got, ok, ids)
			}
		})
	}
}
