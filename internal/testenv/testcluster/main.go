// Command testcluster starts and stops the Redis Cluster the tests share
// (testenv.ClusterAddrsEnv): 3 masters with a replica each, daemonized
// redis-server processes on free 127.0.0.1 ports with their files in DIR.
// .ci/run starts it before the tests and stops it after.
//
//	go run ./internal/testenv/testcluster start DIR   # prints the seed addresses
//	go run ./internal/testenv/testcluster stop DIR
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "start" && os.Args[1] != "stop") {
		fmt.Fprintln(os.Stderr, "usage: testcluster start|stop DIR")
		os.Exit(2)
	}
	dir := os.Args[2]
	if os.Args[1] == "stop" {
		if err := testenv.StopCluster(dir); err != nil {
			fmt.Fprintln(os.Stderr, "testcluster:", err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := testenv.StartCluster(ctx, dir, 3, 1, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testcluster:", err)
		if c != nil {
			_ = testenv.StopCluster(dir)
		}
		os.Exit(1)
	}
	fmt.Println(strings.Join(c.Addrs(), ","))
}
