// Package pgnet bounds how long a PEPSI program's connection to PostgreSQL may
// hang on a network that went silent (a partition, a black hole: no reset, no
// error), on both ends: the client's socket and the server's session. The
// dispatcher and the stage library (so every stage program written with it)
// connect through BoundSilence. It must never open a connection itself.
package pgnet

import (
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The bounds on a network that goes silent (docs/durability.md, "A network that
// goes silent"). Two sides must each notice:
//
// The client (the dispatcher, a stage), on every connection it makes: TCP keepalive probes
// after netKeepAliveIdle of silence, every netKeepAliveInterval, netKeepAliveCount
// of them; and TCP_USER_TIMEOUT netUserTimeout, so bytes the server does not
// acknowledge within it fail the connection (keepalive alone does not apply
// while data is unacknowledged). The lock's own check (lockTiming, at most
// about 15 s) is faster, and is what makes the dispatcher kill its workers; a
// stage's statement on a dead connection fails within them, and the stage
// library reconnects.
//
// The server, on the dispatcher's sessions, through the per-session settings
// tcp_keepalives_idle/interval/count and tcp_user_timeout: it ends a session
// (and releases the dispatcher lock it holds, letting a standby in) only after
// serverSilenceMin without hearing from the dispatcher. That must stay well
// above the lock check's 15 s, so that a cut-off dispatcher has killed its
// workers before a standby can take the lock.
const (
	netKeepAliveIdle     = 10 * time.Second
	netKeepAliveInterval = 5 * time.Second
	netKeepAliveCount    = 3
	netUserTimeout       = 30 * time.Second

	serverKeepAliveIdle     = 20 * time.Second
	serverKeepAliveInterval = 5 * time.Second
	serverKeepAliveCount    = 4
	// serverSilenceMin is how long the server waits, at the least, before it
	// ends a silent session: idle + interval × count, and its user timeout.
	serverSilenceMin = serverKeepAliveIdle + serverKeepAliveCount*serverKeepAliveInterval
)

// BoundSilence sets config so that a connection to a server that went silent
// (a partition, a black hole: no reset, no error) fails within bounded time on
// the client's side, and so that the server ends the session only well
// after the dispatcher's lock check has noticed (the constants above). It
// replaces config's dialer (keeping its connect timeout); server settings the
// connection string already makes are kept. It changes config in place.
func BoundSilence(config *pgx.ConnConfig) {
	dialer := &net.Dialer{
		Timeout:         config.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: netKeepAliveIdle, Interval: netKeepAliveInterval, Count: netKeepAliveCount},
		Control: func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a Unix socket has no TCP settings
			}
			var serr error
			if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, netUserTimeout) }); err != nil {
				return fmt.Errorf("set TCP_USER_TIMEOUT: %w", err)
			}
			if serr != nil {
				return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
			}
			return nil
		},
	}
	config.DialFunc = dialer.DialContext
	if config.RuntimeParams == nil {
		config.RuntimeParams = map[string]string{}
	}
	for _, kv := range [][2]string{
		{"tcp_keepalives_idle", strconv.Itoa(int(serverKeepAliveIdle / time.Second))},
		{"tcp_keepalives_interval", strconv.Itoa(int(serverKeepAliveInterval / time.Second))},
		{"tcp_keepalives_count", strconv.Itoa(serverKeepAliveCount)},
		{"tcp_user_timeout", strconv.Itoa(int(serverSilenceMin / time.Millisecond))},
	} {
		if config.RuntimeParams[kv[0]] == "" {
			config.RuntimeParams[kv[0]] = kv[1]
		}
	}
}
