package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
	return append(os.Environ(),
		"FLASHSALE_HTTP_ADDR=127.0.0.1:0",
		"FLASHSALE_REDIS_MODE=server",
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

// workerProcess is a `flashsale worker` child process.
type workerProcess struct{ cmd *exec.Cmd }

func startWorkerProcess(t *testing.T, bin string, env []string) *workerProcess {
	t.Helper()
	cmd := exec.Command(bin, "worker")
	cmd.Env = env
	cmd.Stderr = io.Discard
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	// The worker prints its address once it consumes; wait for that.
	lines := bufio.NewScanner(stdout)
	ready := make(chan bool, 1)
	go func() {
		ok := false
		for lines.Scan() {
			if strings.Contains(lines.Text(), "listening on") {
				ok = true
				break
			}
		}
		ready <- ok
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("worker process exited before it was ready")
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("worker process not ready after 20s")
	}
	return &workerProcess{cmd: cmd}
}

func (w *workerProcess) kill() {
	_ = w.cmd.Process.Signal(os.Kill)
	_ = w.cmd.Wait()
}

func (w *workerProcess) stop() {
	_ = w.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		w.kill()
	}
}

// TestWorkerKilled: worker processes are SIGKILLed mid-batch five times
// during one sale and restarted; the survivors take over the dead ones'
// deliveries (Redis Streams leases + pending entries), and every invariant
// holds when the system settles.
func TestWorkerKilled(t *testing.T) {
	cfg := realConfig(t, "redisstream")
	cfg.Queue.LeaseTTL = time.Second
	bin := buildBinary(t)
	env := processEnv(cfg)

	// Gateway and notifier in this process; workers only as child processes.
	c := startFrontEnd(t, cfg)

	var mu sync.Mutex
	workers := []*workerProcess{startWorkerProcess(t, bin, env), startWorkerProcess(t, bin, env)}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range workers {
			w.stop()
		}
	})

	campaign := testenv.UniqueName("kill-")
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
