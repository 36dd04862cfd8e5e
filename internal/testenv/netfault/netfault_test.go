package netfault_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
)

// waitMax bounds every wait for something the proxy must do.
const waitMax = 10 * time.Second

// echoServer answers every line with the same line and reports each
// connection's end (EOF or error) on ended.
type echoServer struct {
	ln    net.Listener
	ended chan error
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, ended: make(chan error, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						s.ended <- err
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						s.ended <- err
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func startProxy(t *testing.T, target string) *netfault.Proxy {
	t.Helper()
	p, err := netfault.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *netfault.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip writes line and reads the answer within timeout.
// connected starts an echo server behind a proxy and a client of it, and
// checks that a line makes the round trip: where each fault starts from.
func connected(t *testing.T) (*echoServer, *netfault.Proxy, net.Conn, *bufio.Reader) {
	t.Helper()
	echo := startEcho(t)
	p := startProxy(t, echo.ln.Addr().String())
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "before", waitMax); err != nil {
		t.Fatal(err)
	}
	return echo, p, c, r
}

func roundTrip(c net.Conn, r *bufio.Reader, line string, timeout time.Duration) (string, error) {
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	s, err := r.ReadString('\n')
	if len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s, err
}

func TestProxyForwardsBothWays(t *testing.T) {
	t.Parallel()
	p := startProxy(t, startEcho(t).ln.Addr().String())
	c, r := dial(t, p)
	for _, line := range []string{"hello", string(make([]byte, 100_000))} {
		got, err := roundTrip(c, r, line, waitMax)
		if err != nil || got != line {
			t.Fatalf("round trip of %d bytes: got %d bytes, err %v", len(line), len(got), err)
		}
	}
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Errorf("Conns, Accepted = %d, %d; want 1, 1", p.Conns(), p.Accepted())
	}
}

func TestResetAllResetsTheClientAndClosesTheServerSide(t *testing.T) {
	t.Parallel()
	echo, p, c, r := connected(t)
	p.ResetAll()
	if _, err := roundTrip(c, r, "y", waitMax); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("after ResetAll the client got %v; want a connection reset", err)
	}
	select {
	case err := <-echo.ended:
		if !errors.Is(err, io.EOF) {
			t.Errorf("server side ended with %v; want EOF", err)
		}
	case <-time.After(waitMax):
		t.Fatal("the server side was not closed")
	}
}

// A black hole forwards nothing and closes nothing; what was sent meanwhile is
// delivered when it heals.
func TestBlackHoleHoldsBytesSilentlyUntilHealed(t *testing.T) {
	t.Parallel()
	echo, p, c, r := connected(t)
	p.BlackHole()
	_, err := roundTrip(c, r, "during", 300*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("during the black hole the client read %v; want nothing at all (a deadline)", err)
	}
	// A new connection is accepted but never answered either.
	c2, r2 := dial(t, p)
	if _, err := roundTrip(c2, r2, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection made during the black hole got %v; want silence", err)
	}
	select {
	case err := <-echo.ended:
		t.Fatalf("the server side ended (%v) during the black hole; want it open", err)
	default:
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(waitMax))
	if got, err := r.ReadString('\n'); err != nil || got != "during\n" {
		t.Fatalf("after Heal the held line arrived as %q, %v; want \"during\"", got, err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(waitMax))
	if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("after Heal the new connection's line arrived as %q, %v; want \"new\"", got, err)
	}
}

// DropServerSides is the server giving up on a partitioned client: the server
// side ends now, the client learns it (by a reset) only when the network heals.
func TestDropServerSidesEndsTheServerNowAndResetsTheClientOnHeal(t *testing.T) {
	t.Parallel()
	echo, p, c, r := connected(t)
	p.BlackHole()
	p.DropServerSides()
	select {
	case <-echo.ended:
	case <-time.After(waitMax):
		t.Fatal("the server side was not closed by DropServerSides")
	}
	if _, err := roundTrip(c, r, "y", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client got %v before Heal; want silence", err)
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(waitMax))
	if _, err := r.ReadString('\n'); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after Heal the client read %v; want a connection reset", err)
	}
}

func TestLatencyDelaysEveryChunk(t *testing.T) {
	t.Parallel()
	p := startProxy(t, startEcho(t).ln.Addr().String())
	c, r := dial(t, p)
	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if _, err := roundTrip(c, r, "x", waitMax); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("round trip took %v; want at least 2 × 100ms of added latency", d)
	}
}

func TestRefuseResetsNewConnectionsUntilHealed(t *testing.T) {
	t.Parallel()
	p := startProxy(t, startEcho(t).ln.Addr().String())
	old, oldR := dial(t, p)
	// Dial returns once the kernel has queued the connection; a round trip
	// makes sure the proxy accepted it before it starts refusing.
	if _, err := roundTrip(old, oldR, "first", waitMax); err != nil {
		t.Fatalf("a connection made before Refuse: %v", err)
	}
	p.Refuse()
	// The reset may reach the client while it connects, or at its first read.
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		_, rerr := roundTrip(c, bufio.NewReader(c), "x", waitMax)
		c.Close()
		if rerr == nil {
			t.Fatal("a new connection was answered while refusing")
		}
	}
	if _, err := roundTrip(old, oldR, "still", waitMax); err != nil {
		t.Errorf("an existing connection broke when new ones were refused: %v", err)
	}
	p.Heal()
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, "x", waitMax); err != nil || got != "x" {
		t.Errorf("after Heal a new connection got %q, %v", got, err)
	}
}
