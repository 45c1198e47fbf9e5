package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// startRocketMQProcess runs `flashsale serve` on the rocketmq driver as a
// child process, against a RocketMQ broker double in this process, and
// returns a client of it.
//
// Why a child process: rocketmq-client-go v2.1.2 has data races of its own
// (shared/NOTES-rocketmq.md), and this package's tests run under -race, which
// would fail on them. The child is built without -race; the test process —
// the shoppers, the checks and the broker double, which is race-clean — stays
// under it, and the gateway, worker and notifier code the child runs is
// covered under -race by the other drivers' runs of the same tests. It also
// makes this run the closest to production: the real binary, configured
// through FLASHSALE_* variables, talking to the broker over TCP.
func startRocketMQProcess(t *testing.T, cfg config.Config) *client {
	t.Helper()
	srv, err := rmqtest.Start(rmqtest.Options{})
	if err != nil {
		t.Fatalf("start broker double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() }) // registered first: runs after the process stopped
	// Operators create the topics (docker-compose's rocketmq-init and
	// rocketmq-init-expiry do).
	srv.CreateTopic(cfg.Queue.Topic, cfg.Queue.Partitions)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, cfg.Queue.Partitions)

	bin := buildBinary(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(processEnv(cfg),
		"FLASHSALE_QUEUE_ROCKETMQ_NAME_SERVERS="+srv.Addr(),
		"FLASHSALE_QUEUE_GROUP="+cfg.Queue.Group,
		"FLASHSALE_QUEUE_ROCKETMQ_LOG_LEVEL=error",
		fmt.Sprintf("FLASHSALE_GATEWAY_USER_RATE=%d", cfg.Gateway.UserRate),
		fmt.Sprintf("FLASHSALE_GATEWAY_USER_BURST=%d", cfg.Gateway.UserBurst),
		"FLASHSALE_NOTIFIER_ALLOWED_ORIGINS=*",
	)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start flashsale serve: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			t.Errorf("flashsale serve did not stop within 20s of SIGINT; killing it")
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("flashsale serve stderr:\n%s", stderr.String())
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
	case a := <-addr:
		c := newClient(t, "http://"+a, cfg.Auth)
		c.db = cfg.Database
		return c
	case <-exited:
		t.Fatalf("flashsale serve exited before listening:\n%s", stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("flashsale serve not listening after 20s:\n%s", stderr.String())
	}
	return nil
}

var listeningOn = regexp.MustCompile(`listening on http://(\S+)`)

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
