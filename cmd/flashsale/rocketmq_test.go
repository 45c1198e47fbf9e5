package main

import (
	"fmt"
	"testing"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// The tests on the rocketmq driver run the system as `flashsale` child
// processes against a RocketMQ broker double in this process.
//
// Why child processes: rocketmq-client-go v2.1.2 has data races of its own
// (queue/rocketmq/README.md), and this package's tests run under -race, which would
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
	p := startRole(t, buildBinary(t), "serve", rocketMQEnv(cfg, srv.Addr()))
	return p.client(t, cfg)
}

// startShopFront starts a gateway and a notifier as child processes and
// returns a client of each: shop for purchases and admin, results for polls
// and WebSockets.
func startShopFront(t *testing.T, bin string, cfg config.Config, env []string) (shop, results *client) {
	t.Helper()
	return startRole(t, bin, "gateway", env).client(t, cfg), startRole(t, bin, "notifier", env).client(t, cfg)
}

// createTopics creates the purchase and the expiry topic, as operators do
// (docker-compose's rocketmq-init and rocketmq-init-expiry).
func createTopics(srv *rmqtest.Server, cfg config.Config) {
	srv.CreateTopic(cfg.Queue.Topic, cfg.Queue.Partitions)
	srv.CreateTopic(cfg.Queue.ExpiryTopic, cfg.Queue.Partitions)
}

// startBrokerDouble starts a RocketMQ broker double for one test. Register
// it before the processes that use it: cleanups run in reverse, so it stops
// after them. Under -short the test is skipped (testenv.SkipShort).
func startBrokerDouble(t *testing.T, opts rmqtest.Options) *rmqtest.Server {
	t.Helper()
	testenv.SkipShort(t, "runs against the RocketMQ broker double")
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
