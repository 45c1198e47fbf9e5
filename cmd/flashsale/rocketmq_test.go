package main

import (
	"bufio"
	"bytes"
	"errors"
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

// The tests on the rocketmq driver run the system as `flashsale` child
// processes against a RocketMQ broker double in this process.
//
// Why child processes: rocketmq-client-go v2.1.2 has data races of its own
// (docs/ROCKETMQ.md), and this package's tests run under -race, which would
// fail on them. The children are built without -race; the test process —
// the shoppers, the checks and the broker double, which is race-clean —
// stays under it, and the gateway, worker and notifier code the children run
// is covered under -race by the other drivers' runs of the same tests. It
// also makes these runs the closest to production: the real binary,
// configured through FLASHSALE_* variables, talking to the broker over TCP.

// startRocketMQProcess runs `flashsale serve` on the rocketmq driver as a
// child process, against a broker double of its own, and returns a client of
// it.
func startRocketMQProcess(t *testing.T, cfg config.Config) *client {
	t.Helper()
	srv := startBrokerDouble(t, rmqtest.Options{})
	createTopics(srv, cfg)
	p := startRocketMQRole(t, buildBinary(t), "serve", rocketMQEnv(cfg, srv.Addr()))
	return p.client(t, cfg)
}

// createTopics creates the purchase and the expiry topic, as operators do
// (docker-compose's rocketmq-init and rocketmq-init-expiry).
func createTopics(srv *rmqtest.Server, cfg config.Config) {
	srv.CreateTopic(cfg.Queue.Topic, cfg.Queue.Partitions)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, cfg.Queue.Partitions)
}

// startBrokerDouble starts a RocketMQ broker double for one test. Register
// it before the processes that use it: cleanups run in reverse, so it stops
// after them.
func startBrokerDouble(t *testing.T, opts rmqtest.Options) *rmqtest.Server {
	t.Helper()
	srv, err := rmqtest.Start(opts)
	if err != nil {
		t.Fatalf("start broker double: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// rocketMQEnv expresses cfg as a child's environment on the rocketmq driver,
// with nameServer as the name server.
func rocketMQEnv(cfg config.Config, nameServer string) []string {
	return append(processEnv(cfg),
		"FLASHSALE_QUEUE_ROCKETMQ_NAME_SERVERS="+nameServer,
		"FLASHSALE_QUEUE_GROUP="+cfg.Queue.Group,
		"FLASHSALE_QUEUE_ROCKETMQ_LOG_LEVEL=error",
		fmt.Sprintf("FLASHSALE_GATEWAY_USER_RATE=%d", cfg.Gateway.UserRate),
		fmt.Sprintf("FLASHSALE_GATEWAY_USER_BURST=%d", cfg.Gateway.UserBurst),
		"FLASHSALE_NOTIFIER_ALLOWED_ORIGINS=*",
	)
}

// rocketMQRole is a `flashsale <role>` child process.
type rocketMQRole struct {
	role   string
	cmd    *exec.Cmd
	addr   string // its HTTP listener
	stderr *lockedBuffer
	exited chan struct{}
	err    error // Wait's result, set before exited is closed
}

// startRocketMQRole starts `flashsale <role>` with env and waits until it
// listens. At cleanup it stops the process if the test has not, and shows its
// stderr if the test failed.
func startRocketMQRole(t *testing.T, bin, role string, env []string) *rocketMQRole {
	t.Helper()
	p := &rocketMQRole{role: role, cmd: exec.Command(bin, role), stderr: &lockedBuffer{}, exited: make(chan struct{})}
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
		if err := p.stop(); err != nil {
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
func (p *rocketMQRole) client(t *testing.T, cfg config.Config) *client {
	c := newClient(t, "http://"+p.addr, cfg.Auth)
	c.db = cfg.Database
	return c
}

// stop interrupts the process, as an operator's SIGTERM would, and returns
// an error unless it shuts down cleanly within 20 s. It may be called again.
func (p *rocketMQRole) stop() error {
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
