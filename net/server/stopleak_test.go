package server

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// TestStopClosesConnectionsAcceptedDuringShutdown: clients that connect while the server is
// stopping must all see their connection fail, never a socket that stays open unserved.
// (gnet's acceptor can hand a connection to an event loop that has already exited when gnet
// is stopped from outside; stopGnet shuts the listener first.)
func TestStopClosesConnectionsAcceptedDuringShutdown(t *testing.T) {
	for round := range 30 {
		st := servertest.NewMemStorage()
		cfg := DefaultConfig()
		cfg.Addr = "127.0.0.1:0"
		srv := mustStart(t, cfg, st)
		addr := srv.Addr().String()
		var mu sync.Mutex
		var conns []net.Conn
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.DialTimeout("tcp", addr, time.Second)
					if err != nil {
						continue
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			})
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		if err := srv.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Fatalf("round %d: the listener still accepts after Stop", round)
		}
		st.Close()
		for _, c := range conns {
			// A request gets the connection reset if nothing holds its other end (the kernel
			// may drop a handshake racing the listener's close without telling the client).
			_, _ = c.Write([]byte{0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0})
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("round %d: a connection accepted before Stop returned is still open: %v -> %v", round, c.LocalAddr(), c.RemoteAddr())
			}
			c.Close()
		}
	}
}
