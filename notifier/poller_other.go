//go:build !linux

package notifier

import "errors"

// poller is Linux's epoll; elsewhere every connection reads in a goroutine
// of its own (readBlocking).
type poller struct{}

func newPoller(func(*conn)) (*poller, error) {
	return nil, errors.New("readiness polling needs Linux")
}

func (*poller) add(*conn) bool   { return false }
func (*poller) rearm(*conn) bool { return true }
func (*poller) remove(*conn)     {}
func (*poller) close()           {}
