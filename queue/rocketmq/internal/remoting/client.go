package remoting

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// Client is one connection to a name server or broker. Requests are
// multiplexed by opaque, so Call is safe for concurrent use. Requests the
// server pushes (NOTIFY_CONSUMER_IDS_CHANGED) go to the OnRequest function
// given to Dial, if any; they are not answered.
type Client struct {
	conn      net.Conn
	onRequest func(*Command)

	writeMu sync.Mutex
	opaque  atomic.Int32

	mu      sync.Mutex
	pending map[int32]chan *Command
	err     error         // why the connection ended; set before done is closed
	done    chan struct{} // closed when the read loop ends
}

// ErrClosed is returned by Call once the connection has ended.
var ErrClosed = errors.New("remoting: connection closed")

// Dial connects to addr. onRequest may be nil.
func Dial(ctx context.Context, addr string, onRequest func(*Command)) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("remoting: dial %s: %w", addr, err)
	}
	c := &Client{conn: conn, onRequest: onRequest, pending: make(map[int32]chan *Command), done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

// Addr is the remote address.
func (c *Client) Addr() string { return c.conn.RemoteAddr().String() }

// Call sends req (its opaque is overwritten) and waits for the response or
// until ctx is done. A call abandoned by ctx leaves the connection usable.
func (c *Client) Call(ctx context.Context, req *Command) (*Command, error) {
	ch := make(chan *Command, 1)
	op := c.opaque.Add(1)
	req.Opaque = op
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[op] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, op)
		c.mu.Unlock()
	}()

	if err := c.Send(req); err != nil {
		return nil, err
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-c.done:
		return nil, c.closeErr()
	case <-ctx.Done():
		return nil, fmt.Errorf("remoting: code %d to %s: %w", req.Code, c.Addr(), ctx.Err())
	}
}

// Send writes cmd without waiting for an answer (one-way requests and
// responses to pushed requests).
func (c *Client) Send(cmd *Command) error {
	frame, err := Encode(cmd)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.conn.Write(frame); err != nil {
		return fmt.Errorf("remoting: write to %s: %w", c.Addr(), err)
	}
	return nil
}

// Close closes the connection; pending calls fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) readLoop() {
	r := bufio.NewReader(c.conn)
	var err error
	for {
		var cmd *Command
		cmd, err = Read(r)
		if err != nil {
			break
		}
		if !cmd.IsResponse() {
			if c.onRequest != nil {
				c.onRequest(cmd)
			}
			continue
		}
		c.mu.Lock()
		ch := c.pending[cmd.Opaque]
		c.mu.Unlock()
		select {
		case ch <- cmd: // buffered for the one response; nil ch: the call gave up
		default:
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	c.mu.Unlock()
	_ = c.conn.Close()
	close(c.done)
}
