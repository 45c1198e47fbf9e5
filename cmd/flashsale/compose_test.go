package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gopkg.in/yaml.v3"

	"github.com/flashsale/flashsale/internal/config"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/queue/rocketmq/rmqtest"
)

// The deployment files, relative to this package.
var (
	composePath    = filepath.Join("..", "..", "docker-compose.yml")
	dockerfilePath = filepath.Join("..", "..", "deploy", "Dockerfile")
	productionPath = filepath.Join("..", "..", "configs", "production.yaml")
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     yaml.Node         `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Restart     string            `yaml:"restart"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

// The services that run for good, and the one-shot ones.
var (
	longRunning = []string{"rocketmq-namesrv", "rocketmq-broker", "redis", "mysql", "gateway", "worker", "notifier"}
	oneShot     = []string{"rocketmq-store-init", "rocketmq-init", "rocketmq-init-expiry"}
)

// healthTest returns the service's health check command, nil if none.
func (s composeService) healthTest() []string {
	if s.Healthcheck == nil {
		return nil
	}
	return s.Healthcheck.Test
}

// rocketMQScript is where the RocketMQ services mount deploy/rocketmq.sh.
const rocketMQScript = "/home/rocketmq/rocketmq.sh"

// mountSource returns the host path mounted at dst, if any.
func (s composeService) mountSource(dst string) string {
	for _, v := range s.Volumes {
		if src, d, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":"); d == dst {
			return src
		}
	}
	return ""
}

// command returns the service's command as words, whether it is written
// as a string or a list.
func (s composeService) command(t *testing.T) []string {
	t.Helper()
	switch s.Command.Kind {
	case 0:
		return nil
	case yaml.ScalarNode:
		return strings.Fields(s.Command.Value)
	}
	var words []string
	if err := s.Command.Decode(&words); err != nil {
		t.Fatalf("command: %v", err)
	}
	return words
}

// flagValue returns the word after flag in words.
func flagValue(words []string, flag string) string {
	if i := slices.Index(words, flag); i >= 0 && i+1 < len(words) {
		return words[i+1]
	}
	return ""
}

// TestComposeFile checks docker-compose.yml, deploy/ and
// configs/production.yaml against each other. The docker CLI here has no
// compose plugin (`docker compose config` cannot run; .ci/run uses it when
// it can), so the file is checked as YAML: the services and images the
// deployment needs, Redis with AOF, the broker's configuration, the topic
// setup (checked by deploy/rocketmq.sh), restart policies, health checks
// that can fail, the broker's ports and advertised address (reachable from
// the compose network and the host alike), the app images built from the
// multi-stage, static, non-root Dockerfile, and production.yaml naming
// exactly these services. TestRocketMQScript runs the RocketMQ commands.
func TestComposeFile(t *testing.T) {
	cf := readCompose(t)
	svc := func(name string) composeService {
		t.Helper()
		return cf.service(t, name)
	}

	t.Run("infrastructure images", func(t *testing.T) {
		for name, prefix := range map[string]string{
			"rocketmq-namesrv": "apache/rocketmq:", "rocketmq-broker": "apache/rocketmq:", "rocketmq-init": "apache/rocketmq:",
			"rocketmq-init-expiry": "apache/rocketmq:", "redis": "redis:", "mysql": "mysql:8",
		} {
			if img := svc(name).Image; !strings.HasPrefix(img, prefix) {
				t.Errorf("service %s: got image %q, want %s…", name, img, prefix)
			}
		}
	})

	t.Run("redis keeps an append-only file", func(t *testing.T) {
		if got := flagValue(svc("redis").command(t), "--appendonly"); got != "yes" {
			t.Errorf("redis --appendonly: got %q, want yes", got)
		}
	})

	t.Run("broker configuration", func(t *testing.T) {
		b := svc("rocketmq-broker")
		conf := flagValue(b.command(t), "-c")
		if mounted := b.mountSource(conf); mounted != "./deploy/broker.conf" {
			t.Fatalf("broker -c %s: got it mounted from %q, want ./deploy/broker.conf", conf, mounted)
		}
		props := readProperties(t, filepath.Join("..", "..", "deploy", "broker.conf"))
		host, _, _ := net.SplitHostPort(props["namesrvAddr"])
		checks := []struct{ key, got, want string }{
			{"brokerIP1 (a service name)", props["brokerIP1"], "rocketmq-broker"},
			{"namesrvAddr host (a service name)", host, "rocketmq-namesrv"},
			{"flushDiskType", props["flushDiskType"], "SYNC_FLUSH"},
			{"autoCreateTopicEnable", props["autoCreateTopicEnable"], "false"},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("broker.conf %s: got %q, want %q", c.key, c.got, c.want)
			}
		}
	})

	prod, err := config.Load(productionPath, map[string]string{
		"FLASHSALE_AUTH_JWT_SECRET": strings.Repeat("s", 40), "FLASHSALE_AUTH_ADMIN_TOKEN": "admin-secret-token",
		"FLASHSALE_PAYMENT_WEBHOOK_SECRET": strings.Repeat("w", 32),
	})
	if err != nil {
		t.Fatalf("load %s: %v", productionPath, err)
	}

	// TestRocketMQScript runs these commands: here, that they are the
	// commands it runs.
	t.Run("topics created before use, checked", func(t *testing.T) {
		for service, topic := range map[string]string{"rocketmq-init": prod.Queue.Topic, "rocketmq-init-expiry": prod.Queue.ExpiryTopic} {
			s := svc(service)
			init := s.command(t)
			if len(init) < 3 || !slices.Equal(init[:3], []string{"bash", rocketMQScript, "update-topic"}) ||
				flagValue(init, "-t") != topic || flagValue(init, "-w") == "" {
				t.Errorf("%s: got %v, want bash %s update-topic -t %s with a queue count", service, init, rocketMQScript, topic)
			}
			if src := s.mountSource(rocketMQScript); src != "./deploy/rocketmq.sh" {
				t.Errorf("%s: %s mounted from %q, want ./deploy/rocketmq.sh", service, rocketMQScript, src)
			}
		}
	})

	t.Run("restart policies", func(t *testing.T) {
		for _, name := range longRunning {
			if r := svc(name).Restart; r != "unless-stopped" && r != "always" {
				t.Errorf("service %s: got restart %q, want unless-stopped", name, r)
			}
		}
		for _, name := range oneShot {
			if r := svc(name).Restart; r != "no" {
				t.Errorf("one-shot service %s: got restart %q, want \"no\"", name, r)
			}
		}
	})

	// Health checks are exec'd (CMD), never through a shell, whose pipe
	// would report the last command's status only. TestRocketMQScript runs
	// the RocketMQ ones against the broker double; TestHealthcheck covers
	// the command the app services run.
	t.Run("health checks", func(t *testing.T) {
		for _, name := range longRunning {
			if test := svc(name).healthTest(); len(test) < 2 || test[0] != "CMD" {
				t.Errorf("service %s: got health check %q, want a CMD list", name, test)
			}
		}
		for _, name := range []string{"rocketmq-namesrv", "rocketmq-broker"} {
			s := svc(name)
			if test := s.healthTest(); len(test) < 3 || test[1] != "bash" || test[2] != rocketMQScript {
				t.Errorf("service %s: got health check %v, want bash %s", name, test, rocketMQScript)
			}
			if src := s.mountSource(rocketMQScript); src != "./deploy/rocketmq.sh" {
				t.Errorf("service %s: %s mounted from %q, want ./deploy/rocketmq.sh", name, rocketMQScript, src)
			}
		}
		_, port, _ := net.SplitHostPort(prod.HTTP.Addr)
		want := []string{"CMD", dockerfileBinary(t), "healthcheck", "--url", "http://127.0.0.1:" + port + "/readyz"}
		for _, role := range []string{"gateway", "worker", "notifier"} {
			if got := svc(role).healthTest(); !slices.Equal(got, want) {
				t.Errorf("service %s: got health check %v, want %v", role, got, want)
			}
		}
	})

	// The broker advertises brokerIP1:listenPort. On the compose network
	// the service name resolves; from the host, the same name resolves to
	// 127.0.0.1 (the /etc/hosts line docker-compose.yml documents), so the
	// port must be published as itself, on the loopback only.
	t.Run("broker reachable from the host", func(t *testing.T) {
		props := readProperties(t, filepath.Join("..", "..", "deploy", "broker.conf"))
		if _, ok := cf.Services[props["brokerIP1"]]; !ok {
			t.Errorf("broker.conf brokerIP1 %q: want a service name, which resolves on the compose network", props["brokerIP1"])
		}
		_, nsPort, _ := net.SplitHostPort(props["namesrvAddr"])
		for name, port := range map[string]string{"rocketmq-broker": props["listenPort"], "rocketmq-namesrv": nsPort} {
			want := "127.0.0.1:" + port + ":" + port
			if ports := svc(name).Ports; !slices.Contains(ports, want) {
				t.Errorf("service %s: got ports %v, want %q", name, ports, want)
			}
		}
		raw, err := os.ReadFile(composePath)
		if err != nil {
			t.Fatalf("read compose file: %v", err)
		}
		if hosts := "127.0.0.1 rocketmq-namesrv " + props["brokerIP1"]; !strings.Contains(string(raw), hosts) {
			t.Errorf("docker-compose.yml: does not document the host's /etc/hosts line %q", hosts)
		}
	})

	t.Run("production.yaml names the services", func(t *testing.T) {
		hostOf := func(addr string) string {
			h, _, err := net.SplitHostPort(addr)
			if err != nil {
				t.Errorf("address %q: %v", addr, err)
			}
			return h
		}
		dsn, err := mysql.ParseDSN(prod.Database.DSN)
		if err != nil {
			t.Fatalf("database.dsn: %v", err)
		}
		my := svc("mysql").Environment
		checks := []struct{ key, got, want string }{
			{"queue.driver", prod.Queue.Driver, "rocketmq"},
			{"redis.addr host", hostOf(prod.Redis.Addr), "redis"},
			{"database.dsn host", hostOf(dsn.Addr), "mysql"},
			{"database.dsn database", dsn.DBName, my["MYSQL_DATABASE"]},
			{"database.dsn user", dsn.User, my["MYSQL_USER"]},
			{"database.dsn password", dsn.Passwd, my["MYSQL_PASSWORD"]},
		}
		for _, ns := range prod.Queue.RocketMQ.NameServers {
			checks = append(checks, struct{ key, got, want string }{"queue.rocketmq.name_servers host", hostOf(ns), "rocketmq-namesrv"})
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("production.yaml %s: got %q, want %q", c.key, c.got, c.want)
			}
		}
	})

	t.Run("app services", func(t *testing.T) {
		copied := dockerfileCopies(t)
		for _, role := range []string{"gateway", "worker", "notifier"} {
			s := svc(role)
			if s.Build == nil || s.Build.Dockerfile != "deploy/Dockerfile" {
				t.Errorf("service %s: got build %+v, want deploy/Dockerfile", role, s.Build)
			}
			cmd := s.command(t)
			if len(cmd) == 0 || cmd[0] != role || !slices.Contains(copied, flagValue(cmd, "--config")) {
				t.Errorf("service %s: got command %v, want %s --config <production.yaml as copied by the Dockerfile %v>", role, cmd, role, copied)
			}
			for _, v := range []string{"FLASHSALE_AUTH_JWT_SECRET", "FLASHSALE_AUTH_ADMIN_TOKEN", "FLASHSALE_PAYMENT_WEBHOOK_SECRET"} {
				if !strings.Contains(s.Environment[v], "${"+v) {
					t.Errorf("service %s: %s = %q, want it taken from the environment", role, v, s.Environment[v])
				}
			}
			for _, dep := range []string{"redis", "mysql", "rocketmq-init", "rocketmq-init-expiry"} {
				if _, ok := s.DependsOn[dep]; !ok {
					t.Errorf("service %s: does not wait for %s", role, dep)
				}
			}
		}
	})

	t.Run("references resolve", func(t *testing.T) {
		for name, s := range cf.Services {
			for dep := range s.DependsOn {
				if _, ok := cf.Services[dep]; !ok {
					t.Errorf("service %s depends on %s: no such service", name, dep)
				}
			}
			for _, v := range s.Volumes {
				src, _, _ := strings.Cut(v, ":")
				if strings.HasPrefix(src, ".") {
					if _, err := os.Stat(filepath.Join("..", "..", src)); err != nil {
						t.Errorf("service %s mounts %s: %v", name, src, err)
					}
				} else if _, ok := cf.Volumes[src]; !ok {
					t.Errorf("service %s mounts volume %s: not declared", name, src)
				}
			}
		}
	})
}

// readCompose parses docker-compose.yml.
func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatalf("read compose file: %v", err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("parse %s: %v", composePath, err)
	}
	return cf
}

func (cf composeFile) service(t *testing.T, name string) composeService {
	t.Helper()
	s, ok := cf.Services[name]
	if !ok {
		t.Fatalf("service %s: missing", name)
	}
	return s
}

// TestDockerfile checks the image recipe: multi-stage, a static binary,
// a non-root user.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatalf("read Dockerfile: %v", err)
	}
	var froms int
	var user string
	static := false
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms++
		case "USER":
			user = f[1]
		}
		if slices.Contains(f, "CGO_ENABLED=0") {
			static = true
		}
	}
	if froms < 2 {
		t.Errorf("got %d stages, want a multi-stage build", froms)
	}
	if !static {
		t.Errorf("got no CGO_ENABLED=0 build, want a static binary")
	}
	if name, _, _ := strings.Cut(user, ":"); name == "" || name == "root" || name == "0" {
		t.Errorf("got USER %q, want a non-root user", user)
	}
}

// dockerfileCopies returns the destinations of the Dockerfile's COPY of
// configs/production.yaml.
func dockerfileCopies(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatalf("read Dockerfile: %v", err)
	}
	var out []string
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "COPY" && f[1] == "configs/production.yaml" {
			out = append(out, f[2])
		}
	}
	return out
}

// dockerfileBinary returns where the Dockerfile puts the flashsale binary
// (its ENTRYPOINT).
func dockerfileBinary(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatalf("read Dockerfile: %v", err)
	}
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ENTRYPOINT "); ok {
			var words []string
			if err := yaml.Unmarshal([]byte(rest), &words); err != nil || len(words) == 0 {
				t.Fatalf("Dockerfile ENTRYPOINT %s: want the exec form", rest)
			}
			return words[0]
		}
	}
	t.Fatalf("Dockerfile: no ENTRYPOINT")
	return ""
}

// readProperties reads a key = value file (broker.conf).
func readProperties(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			props[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return props
}

// TestRocketMQScript runs docker-compose.yml's RocketMQ health checks and
// topic setup as written there (deploy/rocketmq.sh for the path it is
// mounted at, and test addresses for the host:port arguments) and checks
// that each passes when it should and fails otherwise. The health checks
// run against the broker double, a port that accepts but never answers, and
// a closed port; the topic setup against a stub mqadmin that prints what
// 4.9.4's UpdateTopicSubCommand prints on success and on failure.
func TestRocketMQScript(t *testing.T) {
	for _, tool := range []string{"bash", "dd", "od", "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.InCI() {
				t.Fatalf("CI=true and %s is missing: deploy/rocketmq.sh needs it", tool)
			}
			t.Skipf("%s is missing: deploy/rocketmq.sh needs it", tool)
		}
	}
	cf := readCompose(t)
	props := readProperties(t, filepath.Join("..", "..", "deploy", "broker.conf"))
	brokerPort := props["listenPort"]

	registered := startBrokerDouble(t, rmqtest.Options{})
	// A broker registers a topic named after itself along with its own
	// (4.9.4's TopicConfigManager); the double routes the topics it has.
	registered.CreateTopic(props["brokerName"], 1)
	unregistered := startBrokerDouble(t, rmqtest.Options{})
	silent, closed := silentAddr(t), closedAddr(t)

	// command returns a service's health check (without "CMD") or its
	// command, with the script's host path, the broker's addresses replaced
	// by broker and the other addresses (name servers) by nameServer, unless
	// they are empty.
	command := func(t *testing.T, service string, health bool, broker, nameServer string) []string {
		t.Helper()
		s := cf.service(t, service)
		words := s.command(t)
		if health {
			if words = s.healthTest(); len(words) < 2 {
				t.Fatalf("service %s: no health check", service)
			}
			words = words[1:]
		}
		out := slices.Clone(words)
		for i, w := range out {
			if w == rocketMQScript {
				out[i] = filepath.Join("..", "..", s.mountSource(rocketMQScript))
			} else if _, port, err := net.SplitHostPort(w); err == nil && port == brokerPort && broker != "" {
				out[i] = broker
			} else if err == nil && nameServer != "" {
				out[i] = nameServer
			}
		}
		return out
	}

	health := []struct {
		name, service      string
		broker, nameServer string
		wantOK             bool
		wantStderrContains string
	}{
		{name: "name server answers", service: "rocketmq-namesrv", nameServer: unregistered.Addr(), wantOK: true},
		{name: "name server silent", service: "rocketmq-namesrv", nameServer: silent},
		{name: "name server down", service: "rocketmq-namesrv", nameServer: closed},
		{name: "broker registered", service: "rocketmq-broker", broker: registered.Addr(), nameServer: registered.Addr(), wantOK: true},
		{name: "broker not registered", service: "rocketmq-broker", broker: unregistered.Addr(), nameServer: unregistered.Addr(),
			wantStderrContains: "not registered"},
		{name: "broker silent", service: "rocketmq-broker", broker: silent, nameServer: registered.Addr()},
		{name: "broker down", service: "rocketmq-broker", broker: closed, nameServer: registered.Addr()},
		{name: "broker's name server down", service: "rocketmq-broker", broker: registered.Addr(), nameServer: closed},
	}
	for _, tc := range health {
		t.Run("health: "+tc.name, func(t *testing.T) {
			t.Parallel()
			args := command(t, tc.service, true, tc.broker, tc.nameServer)
			out, err := runScript(t, args, nil)
			if (err == nil) != tc.wantOK || !strings.Contains(out, tc.wantStderrContains) {
				t.Errorf("%v: got %v (output %q), want success %v", args, err, out, tc.wantOK)
			}
		})
	}

	// What UpdateTopicSubCommand (4.9.4, -c CLUSTER) prints: one "create
	// topic to <master> success." line per master, then the topic's config
	// (TopicConfig.toString) once every master took it; on an error, the
	// stack trace of a SubCommandException (and mqadmin still exits 0).
	created := func(topic string) string {
		return "create topic to 172.18.0.3:10911 success.\nTopicConfig [topicName=" + topic +
			", readQueueNums=16, writeQueueNums=16, perm=RW-, topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]"
	}
	const failed = "org.apache.rocketmq.tools.command.SubCommandException: UpdateTopicSubCommand command failed\n" +
		"\tat org.apache.rocketmq.tools.command.topic.UpdateTopicSubCommand.execute(UpdateTopicSubCommand.java:177)\n" +
		"Caused by: org.apache.rocketmq.remoting.exception.RemotingConnectException: connect to 172.18.0.3:10911 failed"
	for _, service := range []string{"rocketmq-init", "rocketmq-init-expiry"} {
		args := command(t, service, false, "", "")
		topic := flagValue(args, "-t")
		updates := []struct {
			name   string
			output string
			wantOK bool
		}{
			{name: "created", output: created(topic), wantOK: true},
			{name: "error", output: failed},
			{name: "no master in the cluster", output: "TopicConfig [topicName=" + topic + ", readQueueNums=16]"},
			{name: "second master failed", output: "create topic to 172.18.0.3:10911 success.\n" + failed},
			{name: "another topic", output: created(topic + "-other")},
		}
		for _, tc := range updates {
			t.Run(service+": "+tc.name, func(t *testing.T) {
				t.Parallel()
				home := stubMQAdmin(t, tc.output)
				out, err := runScript(t, args, []string{"ROCKETMQ_HOME=" + home})
				if (err == nil) != tc.wantOK {
					t.Errorf("%v: got %v (output %q), want success %v", args, err, out, tc.wantOK)
				}
				got, _ := os.ReadFile(filepath.Join(home, "args"))
				if want := "updateTopic " + strings.Join(args[3:], " ") + "\n"; string(got) != want {
					t.Errorf("mqadmin ran with %q, want %q", got, want)
				}
			})
		}
	}
}

// runScript runs args (bash and the script first) and returns its output.
func runScript(t *testing.T, args, env []string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// stubMQAdmin makes a ROCKETMQ_HOME whose bin/mqadmin records its arguments
// in ROCKETMQ_HOME/args and prints output.
func stubMQAdmin(t *testing.T, output string) string {
	t.Helper()
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := os.WriteFile(filepath.Join(home, "output"), []byte(output), 0o644); err != nil {
		t.Fatalf("write output: %v", err)
	}
	stub := `echo "$*" > "$ROCKETMQ_HOME/args"` + "\n" + `cat "$ROCKETMQ_HOME/output"` + "\n"
	if err := os.WriteFile(filepath.Join(home, "bin", "mqadmin"), []byte(stub), 0o644); err != nil {
		t.Fatalf("write mqadmin: %v", err)
	}
	return home
}

// silentAddr is a port that accepts connections and never answers.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// closedAddr is a port nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
