package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
)

// buildBinary compiles this command once for tests that need real processes.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashsale")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// processEnv expresses cfg as the FLASHSALE_* variables a process reads.
func processEnv(cfg config.Config) []string {
	env := os.Environ()
	if cfg.Redis.Mode == "cluster" {
		env = append(env, "FLASHSALE_REDIS_ADDRS="+strings.Join(cfg.Redis.Addrs, ","))
	}
	if cfg.Degrade != "" {
		env = append(env, "FLASHSALE_DEGRADE="+cfg.Degrade)
	}
	return append(env,
		"FLASHSALE_HTTP_ADDR=127.0.0.1:0",
		"FLASHSALE_REDIS_MODE="+cfg.Redis.Mode,
		"FLASHSALE_REDIS_ADDR="+cfg.Redis.Addr,
		"FLASHSALE_DATABASE_DRIVER="+cfg.Database.Driver,
		"FLASHSALE_DATABASE_DSN="+cfg.Database.DSN,
		"FLASHSALE_AUTH_JWT_SECRET="+cfg.Auth.JWTSecret,
		"FLASHSALE_AUTH_ADMIN_TOKEN="+cfg.Auth.AdminToken,
		"FLASHSALE_AUTH_DEV=false",
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET="+cfg.Payment.WebhookSecret,
		"FLASHSALE_PAYMENT_GRACE="+cfg.Payment.Grace.String(),
		"FLASHSALE_PAYMENT_SWEEP_INTERVAL="+cfg.Payment.SweepInterval.String(),
		"FLASHSALE_QUEUE_DRIVER="+cfg.Queue.Driver,
		"FLASHSALE_QUEUE_TOPIC="+cfg.Queue.Topic,
		"FLASHSALE_QUEUE_EXPIRY_TOPIC="+cfg.Queue.ExpiryTopic,
		"FLASHSALE_QUEUE_LEASE_TTL="+cfg.Queue.LeaseTTL.String(),
		"FLASHSALE_WORKER_MAX_QUEUE_DELAY="+cfg.Worker.MaxQueueDelay.String(),
		"FLASHSALE_NOTIFIER_MAX_CONNS_PER_IP="+strconv.Itoa(cfg.Notifier.MaxConnsPerIP),
		"FLASHSALE_LOG_LEVEL=error",
	)
}

// startFrontEnd runs a gateway and a notifier in this process, for tests
// whose workers are child processes, and returns a client of them.
func startFrontEnd(t *testing.T, cfg config.Config) *client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sys, err := start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), roleSet{gateway: true, notifier: true})
	if err != nil {
		cancel()
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() { cancel(); _ = sys.Wait() })
	c := newClient(t, "http://"+sys.Addr(), cfg.Auth)
	c.db = cfg.Database
	return c
}

// roleProcess is a `flashsale <role>` child process.
type roleProcess struct {
	role   string
	cmd    *exec.Cmd
	addr   string // its HTTP listener
	stderr *lockedBuffer
	exited chan struct{}
	err    error // Wait's result, set before exited is closed
	killed atomic.Bool
}

// startRole starts `flashsale <role>` with env and waits until it
// listens. At cleanup it stops the process if the test has not, and shows its
// stderr if the test failed.
func startRole(t *testing.T, bin, role string, env []string) *roleProcess {
	t.Helper()
	p := &roleProcess{role: role, cmd: exec.Command(bin, role), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start flashsale %s: %v", role, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		if err := p.stop(); err != nil && !p.killed.Load() {
			t.Errorf("flashsale %s: %v", role, err)
		}
		if t.Failed() {
			t.Logf("flashsale %s stderr:\n%s", role, p.stderr.String())
		}
	})

	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if m := listeningOn.FindStringSubmatch(lines.Text()); m != nil {
				addr <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p.addr = <-addr:
		return p
	case <-p.exited:
		t.Fatalf("flashsale %s exited before listening:\n%s", role, p.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("flashsale %s not listening after 20s:\n%s", role, p.stderr.String())
	}
	return nil
}

var listeningOn = regexp.MustCompile(`listening on http://(\S+)`)

// client returns a client of the process's HTTP listener.
func (p *roleProcess) client(t *testing.T, cfg config.Config) *client {
	c := newClient(t, "http://"+p.addr, cfg.Auth)
	c.db = cfg.Database
	return c
}

// kill SIGKILLs the process, as a crash would, and waits until it is gone;
// its cleanup then expects no clean exit.
func (p *roleProcess) kill() {
	p.killed.Store(true)
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop interrupts the process, as an operator's SIGTERM would, and returns
// an error unless it shuts down cleanly within 20 s. It may be called again.
func (p *roleProcess) stop() error {
	select {
	case <-p.exited:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("did not stop within 20s of SIGINT; killed")
	}
}

// lockedBuffer collects a child's stderr; the child writes while the test
// may read.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startWorkerProcess starts a `flashsale worker` child process.
func startWorkerProcess(t *testing.T, bin string, env []string) *roleProcess {
	return startRole(t, bin, "worker", env)
}

// TestWorkerKilled: worker processes are SIGKILLed mid-batch five times
// during one sale and restarted; the survivors take over the dead ones'
// deliveries (Redis Streams leases + pending entries), and every invariant
// holds when the system settles.
func TestWorkerKilled(t *testing.T) {
	testenv.SkipShort(t, "a fault test: kills workers mid-sale")
	cfg := realConfig(t, "redisstream")
	cfg.Queue.LeaseTTL = time.Second
	bin := buildBinary(t)
	env := processEnv(cfg)

	// Gateway and notifier in this process; workers only as child processes.
	c := startFrontEnd(t, cfg)

	var mu sync.Mutex
	// Each process stops at its test's cleanup, and must stop cleanly
	// unless it was killed.
	workers := []*roleProcess{startWorkerProcess(t, bin, env), startWorkerProcess(t, bin, env)}

	campaign := testenv.Name(t, "kill-")
	soak := testenv.Soak()
	stock, limit := int64(400*soak), int64(1)
	c.openCampaign(campaign, stock, limit)

	killed := make(chan int, 1)
	go func() {
		kills := 0
		for i := range 5 * soak {
			time.Sleep(400 * time.Millisecond)
			if c.stats(campaign).Remaining == 0 {
				break
			}
			mu.Lock()
			workers[i%2].kill()
			kills++
			workers[i%2] = startWorkerProcess(t, bin, env)
			mu.Unlock()
		}
		killed <- kills
	}()
	// About 100 purchases a second: the sale outlasts five kill-and-restart
	// rounds.
	admitted, codes := shopPaced(t, c, campaign, 1000*soak, 10, 100*time.Millisecond)
	if kills := <-killed; kills != 5*soak {
		t.Errorf("only %d kills happened mid-sale, want %d (the sale ended too early)", kills, 5*soak)
	}
	st := c.settle(campaign, 60*time.Second)
	byStatus := verifySettled(t, c, campaign, stock, limit, admitted, st)
	if st.Sold != stock {
		t.Errorf("sold %d, want %d: demand exceeded stock, so nothing may be undersold", st.Sold, stock)
	}
	t.Logf("codes %v, results %v", codes, byStatus)
}
