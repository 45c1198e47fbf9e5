package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterAddrsEnv names the shared test Redis Cluster: its seed nodes,
// comma-separated. .ci/run starts one (cmd testcluster) and sets it.
const ClusterAddrsEnv = "FLASHSALE_TEST_REDIS_CLUSTER_ADDRS"

// ClusterAddrs returns the shared test cluster's seed addresses, checking
// that it answers with every slot served; without one the test is skipped on
// a laptop and fails under CI=true. Under -short it is skipped (SkipShort).
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	SkipShort(t, "needs the Redis Cluster")
	v := os.Getenv(ClusterAddrsEnv)
	if v == "" {
		unavailable(t, "%s is not set (.ci/run starts a cluster and sets it)", ClusterAddrsEnv)
	}
	addrs := strings.Split(v, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clusterHealthy(ctx, addrs[0], 0); err != nil {
		unavailable(t, "the Redis Cluster at %s is not healthy: %v", v, err)
	}
	return addrs
}

// RedisCluster returns a client of the shared test cluster, closed at
// cleanup. Tests share it as they share the test Redis: their keys carry
// names from Name, whose cleanup deletes them on every master.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(t), PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster is a Redis Cluster of redis-server processes on 127.0.0.1, each
// on a port of its own with its files in Dir.
type Cluster struct {
	Dir   string
	Ports []int
	// procs are the nodes a test started (StartCluster with daemon false);
	// a daemonized cluster is stopped through its pid files (StopCluster).
	procs map[int]*exec.Cmd
}

// Addrs returns every node's address.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Ports))
	for i, p := range c.Ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return addrs
}

// PrivateCluster starts a cluster of masters masters with replicas replicas
// each for one test (a fault test that kills nodes must not disturb the
// shared one) and stops it at cleanup. It needs redis-server and redis-cli:
// without them the test is skipped on a laptop and fails under CI=true.
// Under -short it is skipped (SkipShort).
func PrivateCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	SkipShort(t, "starts a Redis Cluster of its own")
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			unavailable(t, "%s is not installed (apt-get install redis-server)", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, t.TempDir(), masters, replicas, false)
	if c != nil {
		t.Cleanup(c.Stop)
	}
	if err != nil {
		t.Fatalf("start a Redis Cluster: %v", err)
	}
	return c
}

// StartCluster starts masters*(1+replicas) nodes with their files in dir,
// joins them with redis-cli --cluster create and waits until every node
// sees every slot served and every replica is linked to its master. With
// daemon the nodes outlive this process (stop them with StopCluster(dir));
// without it they are this process's children. On error the nodes already
// started are left for the caller's Stop.
func StartCluster(ctx context.Context, dir string, masters, replicas int, daemon bool) (*Cluster, error) {
	n := masters * (1 + replicas)
	ports, err := clusterPorts(n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Ports: ports, procs: map[int]*exec.Cmd{}}
	for _, p := range ports {
		if err := c.startNode(p, daemon); err != nil {
			return c, err
		}
	}
	for _, a := range c.Addrs() {
		if err := waitPing(ctx, a); err != nil {
			return c, err
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return c, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	for _, a := range c.Addrs() {
		for {
			err := clusterHealthy(ctx, a, n)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return c, fmt.Errorf("node %s: %w", a, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

// startNode starts one node. The bus port is port+10000 (Redis's rule).
// A short node timeout makes a killed master's replica take over within a
// few seconds, and a replica's first sync starts at once instead of after
// the default 5 s; nothing is kept on disk but the cluster's own config file.
func (c *Cluster) startNode(port int, daemon bool) error {
	p := strconv.Itoa(port)
	args := []string{"--port", p, "--bind", "127.0.0.1", "--cluster-enabled", "yes",
		"--cluster-config-file", "nodes-" + p + ".conf", "--cluster-node-timeout", "2000",
		"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", c.Dir, "--logfile", "node-" + p + ".log",
		"--pidfile", filepath.Join(c.Dir, "node-"+p+".pid")}
	if daemon {
		args = append(args, "--daemonize", "yes")
		if out, err := exec.Command("redis-server", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("redis-server on %s: %v: %s", p, err, out)
		}
		return nil
	}
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis-server on %s: %w", p, err)
	}
	c.procs[port] = cmd
	return nil
}

// Kill stops the node on port with SIGKILL, as a crash would.
func (c *Cluster) Kill(port int) error {
	cmd, ok := c.procs[port]
	if !ok {
		return fmt.Errorf("no node of this process on port %d", port)
	}
	delete(c.procs, port)
	err := cmd.Process.Kill()
	_ = cmd.Wait()
	return err
}

// ReplicaAddr returns the address of master's first replica.
func ReplicaAddr(t testing.TB, master *redis.Client) string {
	t.Helper()
	info, err := master.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		fields, ok := strings.CutPrefix(line, "slave0:")
		if !ok {
			continue
		}
		var ip, port string
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "ip="); ok {
				ip = v
			} else if v, ok := strings.CutPrefix(f, "port="); ok {
				port = v
			}
		}
		return net.JoinHostPort(ip, port)
	}
	t.Fatalf("no replica in %q", info)
	return ""
}

// StopReplicaOf stops the first replica of master with SIGSTOP, so that
// WAIT on master falls short, until the returned resume (also run at t's
// cleanup) sends SIGCONT.
func (c *Cluster) StopReplicaOf(t testing.TB, master *redis.Client) (resume func()) {
	t.Helper()
	_, port, _ := net.SplitHostPort(ReplicaAddr(t, master))
	b, err := os.ReadFile(filepath.Join(c.Dir, "node-"+port+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// Stop kills the nodes this process started.
func (c *Cluster) Stop() {
	for p := range c.procs {
		_ = c.Kill(p)
	}
}

// StopCluster stops the daemonized nodes whose pid files are in dir.
func StopCluster(dir string) error {
	pids, err := filepath.Glob(filepath.Join(dir, "node-*.pid"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// clusterPorts picks n ports that are free, as are their bus ports
// (+10000), at random so that runs side by side do not collide. Both stay
// below the kernel's ephemeral range (32768 on): a port there that is
// free when checked can be an outgoing connection's by the time the node
// binds it, which a busy test run (CI) makes likely.
func clusterPorts(n int) ([]int, error) {
	var ports []int
	taken := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("no free ports for a Redis Cluster")
		}
		p := 20000 + rand.IntN(2700) // bus ports 30000-32699
		if taken[p] || !portFree(p) || !portFree(p+10000) {
			continue
		}
		taken[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func waitPing(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("node %s does not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterHealthy reports nil when the node at addr says the cluster is ok
// with every slot served, knows at least nodes nodes (0: any number), and,
// if it is a replica, is linked to its master.
func clusterHealthy(ctx context.Context, addr string, nodes int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	fields := infoFields(info)
	if fields["cluster_state"] != "ok" || fields["cluster_slots_ok"] != "16384" {
		return fmt.Errorf("cluster_state %s, %s slots ok", fields["cluster_state"], fields["cluster_slots_ok"])
	}
	if known, _ := strconv.Atoi(fields["cluster_known_nodes"]); known < nodes {
		return fmt.Errorf("knows %d of %d nodes", known, nodes)
	}
	repl, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	r := infoFields(repl)
	if r["role"] == "slave" && r["master_link_status"] != "up" {
		return fmt.Errorf("replica's link to its master is %s", r["master_link_status"])
	}
	return nil
}

// infoFields parses the key:value lines of INFO and CLUSTER INFO.
func infoFields(s string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m
}
