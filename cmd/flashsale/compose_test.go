package main

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"gopkg.in/yaml.v3"

	"github.com/flashsale/flashsale/internal/config"
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
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
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
// setup, the app images built from the multi-stage, static, non-root
// Dockerfile, and production.yaml naming exactly these services.
func TestComposeFile(t *testing.T) {
	raw, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatalf("read compose file: %v", err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("parse %s: %v", composePath, err)
	}
	svc := func(name string) composeService {
		t.Helper()
		s, ok := cf.Services[name]
		if !ok {
			t.Fatalf("service %s: missing", name)
		}
		return s
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
		var mounted string
		for _, v := range b.Volumes {
			if src, dst, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":"); dst == conf {
				mounted = src
			}
		}
		if mounted != "./deploy/broker.conf" {
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

	t.Run("topics created before use", func(t *testing.T) {
		for service, topic := range map[string]string{"rocketmq-init": prod.Queue.Topic, "rocketmq-init-expiry": prod.Queue.ExpiryTopic} {
			init := svc(service).command(t)
			if !slices.Contains(init, "updateTopic") || flagValue(init, "-t") != topic || flagValue(init, "-w") == "" {
				t.Errorf("%s: got %v, want mqadmin updateTopic -t %s with a queue count", service, init, topic)
			}
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
