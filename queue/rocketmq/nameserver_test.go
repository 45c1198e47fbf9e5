package rocketmq_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue"
)

// TestNameServerMoves: the name server is configured by host name, and its
// host gets a new IP (a recreated container). The old address refuses
// connections; publishing and consuming carry on through the new one, and
// Ping recovers, without restarting anything.
//
// The host name resolves through a DNS server of the test's own, installed
// as net.DefaultResolver: the library dials name servers itself, so the
// process's resolver is the only way in. The test is not parallel, so the
// swap happens while no other test of the package runs (they all run
// without -race: see rocketmq_test.go).
func TestNameServerMoves(t *testing.T) {
	const host = "namesrv.flashsale.test"
	dns := startDNS(t, host)
	srv := startDouble(t)
	// The double answers as name server and broker on every listener, and
	// names the listener a client came in through as the broker: moving the
	// listener moves both, as recreating a one-host cluster would.
	before, err := srv.ListenAt("127.0.0.2:0")
	if err != nil {
		t.Fatalf("listen on 127.0.0.2 (Linux routes all of 127.0.0.0/8 to the loopback): %v", err)
	}
	_, port, _ := net.SplitHostPort(before.Addr())
	dns.point("127.0.0.2")

	opts := testOptions(net.JoinHostPort(host, port))
	opts.ProbeTimeout = time.Second
	q := mustNew(t, opts)
	topic := testenv.Topic(t)
	srv.CreateTopic(topic, 2)
	rec := startRecording(t, q.Consumer("c"), topic, nil)
	publish(t, q, topic, queue.Message{ID: "before", Key: "k"})
	testenv.Eventually(t, 20*time.Second, "the message published before the move", func() (bool, string) {
		return len(rec.deliveries("before")) > 0, "not consumed"
	})

	after, err := srv.ListenAt(net.JoinHostPort("127.0.0.3", port))
	if err != nil {
		t.Fatalf("listen on 127.0.0.3:%s: %v", port, err)
	}
	dns.point("127.0.0.3")
	if err := before.Close(); err != nil {
		t.Fatalf("close the old listener: %v", err)
	}
	moved := time.Now()

	// The clients find the new address once their old connections have
	// broken and they next look a route up (every 30 s).
	var lastTry time.Time
	var lastErr error
	testenv.Eventually(t, 90*time.Second, "a publish through the moved name server", func() (bool, string) {
		if time.Since(lastTry) < 500*time.Millisecond {
			return false, fmt.Sprintf("last publish: %v", lastErr)
		}
		lastTry = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lastErr = q.Publish(ctx, topic, queue.Message{ID: "after", Key: "k"})
		return lastErr == nil, fmt.Sprintf("last publish: %v", lastErr)
	})
	testenv.Eventually(t, 90*time.Second, "the message published after the move", func() (bool, string) {
		return len(rec.deliveries("after")) > 0, "not consumed"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.Ping(ctx); err != nil {
		t.Errorf("Ping after the move: got %v, want nil", err)
	}
	if n := dns.answered("127.0.0.3"); n == 0 {
		t.Errorf("DNS answers with the new address: got none, want the clients to have looked the host up again")
	}
	t.Logf("publish and consume recovered %v after the move (through %s)", time.Since(moved).Round(time.Second), after.Addr())
}

// fakeDNS answers A queries for one host name with an address the test
// chooses, and everything else with NXDOMAIN (AAAA: no records).
type fakeDNS struct {
	host string // fully qualified, with the trailing dot

	mu      sync.Mutex
	ip      net.IP
	answers map[string]int // by address given
}

// startDNS serves DNS on a loopback UDP port and makes it the process's
// resolver until the test ends.
func startDNS(t *testing.T, host string) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen udp: %v", err)
	}
	d := &fakeDNS{host: host + ".", answers: make(map[string]int)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.serve(pc)
	}()
	old := net.DefaultResolver
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		return dialer.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	t.Cleanup(func() {
		net.DefaultResolver = old
		_ = pc.Close()
		<-done
	})
	return d
}

// point makes the host name resolve to ip from now on.
func (d *fakeDNS) point(ip string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ip = net.ParseIP(ip).To4()
}

// answered returns how many answers gave ip.
func (d *fakeDNS) answered(ip string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.answers[ip]
}

func (d *fakeDNS) serve(pc net.PacketConn) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var query dnsmessage.Message
		if err := query.Unpack(buf[:n]); err != nil || len(query.Questions) != 1 {
			continue
		}
		resp := d.answer(query)
		if out, err := resp.Pack(); err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

func (d *fakeDNS) answer(query dnsmessage.Message) dnsmessage.Message {
	q := query.Questions[0]
	resp := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: query.ID, Response: true, Authoritative: true, RecursionDesired: query.RecursionDesired},
		Questions: query.Questions,
	}
	if !strings.EqualFold(q.Name.String(), d.host) {
		resp.RCode = dnsmessage.RCodeNameError
		return resp
	}
	if q.Type != dnsmessage.TypeA {
		return resp // the name exists, with no record of that type
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ip == nil {
		return resp
	}
	var a dnsmessage.AResource
	copy(a.A[:], d.ip)
	resp.Answers = []dnsmessage.Resource{{
		Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET},
		Body:   &a,
	}}
	d.answers[d.ip.String()]++
	return resp
}
