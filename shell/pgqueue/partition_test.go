package pgqueue_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/shell/pgqueue"
	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
)

// proxy forwards TCP connections to PostgreSQL and can freeze: it then holds
// every byte in both directions without closing anything, as a network
// partition does (no reset, no error, just silence).
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	thaw  chan struct{} // nil while not frozen; closed by unfreeze
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		p.unfreeze()
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

func (p *proxy) pipe(src, dst net.Conn) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close the other side too
		}
	}
}

// gate blocks while the proxy is frozen.
func (p *proxy) gate() {
	p.mu.Lock()
	thaw := p.thaw
	p.mu.Unlock()
	if thaw != nil {
		<-thaw
	}
}

func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw == nil {
		p.thaw = make(chan struct{})
	}
}

func (p *proxy) unfreeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw != nil {
		close(p.thaw)
		p.thaw = nil
	}
}

// viaProxy returns a config for url that connects through a new proxy.
func viaProxy(t *testing.T, url string) (*pgx.ConnConfig, *proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	addr := p.ln.Addr().(*net.TCPAddr)
	cfg.Host, cfg.Port, cfg.Fallbacks = "127.0.0.1", uint16(addr.Port), nil
	return cfg, p
}

// TestListenNoticesASilentPartition: with no error from the network, the idle
// check finds the connection dead, the listener reports Down, and Up once the
// network heals. Idle checks of a healthy connection report nothing.
func TestListenNoticesASilentPartition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg, p := viaProxy(t, url)
	notices := make(chan pgqueue.Notice, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- pgqueue.ListenTimed(ctx, cfg, nil, func(n pgqueue.Notice) { notices <- n }, 50*time.Millisecond, 300*time.Millisecond)
	}()
	t.Cleanup(func() { cancel(); <-done })
	r := &listenerRun{notices: notices}
	r.expect(t, pgqueue.Listening, "start")

	// Let several idle checks pass on a healthy connection; none may report.
	time.Sleep(400 * time.Millisecond)
	writer := pgtest.Connect(t, url)
	if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, pgqueue.Notified, "after idle checks on a healthy connection, then an insert")

	p.freeze()
	r.expect(t, pgqueue.Down, "after the network went silent")
	p.unfreeze()
	r.expect(t, pgqueue.Up, "after the network healed")
	if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, pgqueue.Notified, "after an insert once healed")
}

// TestLockIsLostOnASilentPartition: a dispatcher cut off from its database
// cannot count on its lock; the idle check notices and closes Lost.
func TestLockIsLostOnASilentPartition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg, p := viaProxy(t, url)
	l, err := pgqueue.TryLockTimed(t.Context(), cfg, 50*time.Millisecond, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	time.Sleep(400 * time.Millisecond) // several idle checks of a healthy connection
	select {
	case <-l.Lost():
		t.Fatalf("Lost closed on a healthy connection: %v", l.Err())
	default:
	}
	p.freeze()
	select {
	case <-l.Lost():
	case <-time.After(waitFor):
		t.Fatalf("Lost not closed within %v of the network going silent", waitFor)
	}
}
