// Package netfault is a TCP proxy on 127.0.0.1 for tests: it stands between
// PEPSI's programs and PostgreSQL and breaks the network between them on
// command, the ways a real network breaks:
//
//   - ResetAll: every connection is reset (RST to the client, the server sees
//     its socket close), as a restarted firewall or a crashed middlebox does;
//   - BlackHole: nothing is forwarded any more, in either direction, and no
//     socket is closed: a silent partition, which TCP alone takes minutes to
//     notice. New connections are accepted but never reach the server;
//   - DropServerSides: during a black hole, the server's side of every
//     connection is closed, as when the server's own TCP keepalive gives up on
//     a partitioned client; the client's side stays silent, and is reset when
//     the black hole heals (its packets then reach a host that forgot it);
//   - SetLatency: every chunk of bytes is delivered that much later;
//   - Refuse: new connections are reset at once (a server out of connection
//     slots, a firewall's REJECT).
//
// Heal turns every fault off. Bytes held during a black hole are delivered,
// in order, when it heals, as TCP's retransmissions would deliver them. It is a
// test helper: it never decides anything, and every buffer is bounded (a
// direction holds at most chunkQueueMax chunks of chunkSizeMax bytes; beyond
// that it stops reading, and TCP's flow control stops the sender).
package netfault

import (
	"fmt"
	"net"
	"sync"
	"time"
)

const (
	chunkSizeMax  = 32 << 10
	chunkQueueMax = 64
)

// Proxy forwards TCP connections from its address to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	latency  time.Duration
	gate     chan struct{} // non-nil during a black hole; closed when it heals
	refuse   bool
	links    map[*link]struct{}
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	serverGone     bool // DropServerSides closed the server side; reset the client on Heal
	once           sync.Once
}

// Start listens on a free port of 127.0.0.1 and forwards every connection to
// target ("host:port").
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
	for l := range p.links {
		p.dropLocked(l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// Conns is the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted is the number of connections accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// ResetAll resets every open connection: the client gets an RST, the server
// sees its socket closed.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		reset(l.client)
		p.dropLocked(l)
	}
}

// BlackHole stops forwarding, in both directions and for new connections,
// without closing anything, until Heal.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil && !p.closed {
		p.gate = make(chan struct{})
	}
}

// DropServerSides closes the server's side of every open connection and
// leaves the client's side open and silent; Heal resets the client's side.
// Meant for a black hole: it is what the server does when its keepalive gives
// up on a client it cannot reach.
func (p *Proxy) DropServerSides() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.server != nil && !l.serverGone {
			l.serverGone = true
			_ = l.server.Close()
		}
	}
}

// SetLatency delays every chunk read from now on by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Refuse resets every new connection at once until Heal.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = true
}

// Heal turns every fault off: held bytes flow again, in order; connections
// whose server side was dropped are reset.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.refuse = 0, false
	for l := range p.links {
		if l.serverGone {
			reset(l.client)
			p.dropLocked(l)
		}
	}
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// currentGate is the black hole's gate, or nil.
func (p *Proxy) currentGate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate
}

// pass waits while the network is black-holed.
func (p *Proxy) pass() {
	for {
		g := p.currentGate()
		if g == nil {
			return
		}
		<-g
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		refuse, closed := p.refuse, p.closed
		l := &link{client: client}
		if !refuse && !closed {
			p.links[l] = struct{}{}
		}
		p.mu.Unlock()
		if refuse || closed {
			reset(client)
			_ = client.Close()
			continue
		}
		p.wg.Add(1)
		go p.connect(l)
	}
}

// connect dials the target for l (once any black hole has healed) and starts
// forwarding both ways.
func (p *Proxy) connect(l *link) {
	defer p.wg.Done()
	p.pass()
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	p.mu.Lock()
	_, open := p.links[l]
	if err == nil && open {
		l.server = server
	}
	p.mu.Unlock()
	if err != nil || !open {
		if server != nil {
			_ = server.Close()
		}
		p.drop(l)
		return
	}
	p.wg.Add(2)
	go p.forward(l, l.client, server)
	go p.forward(l, server, l.client)
}

// chunk is bytes read, to be written at due.
type chunk struct {
	data []byte
	due  time.Time
}

// forward copies src to dst through a bounded queue, applying latency and the
// black hole, and closes the link when either side ends.
func (p *Proxy) forward(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	queue := make(chan chunk, chunkQueueMax)
	done := make(chan struct{})
	go func() { // writer
		defer close(done)
		for c := range queue {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			p.pass()
			if _, err := dst.Write(c.data); err != nil {
				p.drop(l)
				for range queue { // let the reader finish
				}
				return
			}
		}
	}()
	for {
		buf := make([]byte, chunkSizeMax)
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat := p.latency
			p.mu.Unlock()
			queue <- chunk{data: buf[:n], due: time.Now().Add(lat)}
		}
		if err != nil {
			break
		}
	}
	close(queue)
	<-done
	// What was read has been written (or could not be): end the link, unless
	// only its server side was dropped on purpose (the client waits for Heal).
	p.mu.Lock()
	gone := l.serverGone
	p.mu.Unlock()
	if !gone {
		p.drop(l)
	}
}

// drop closes l and forgets it.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(l)
}

// dropLocked is drop with p.mu held.
func (p *Proxy) dropLocked(l *link) {
	l.close()
	delete(p.links, l)
}

// close closes both sides.
func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
	})
}

// reset makes the next close of c send an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
