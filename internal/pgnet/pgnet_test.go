package pgnet_test

import (
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/pepsi-pipeline/pepsi/internal/pgnet"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// BoundSilence makes both ends of a connection give up on a silent
// peer in bounded time: the server's session settings say when PostgreSQL ends
// the session (and releases the lock), the socket's TCP_USER_TIMEOUT and
// keepalive when the dispatcher's side fails.
func TestBoundSilenceSetsTheServersKeepalivesAndTheSocketsUserTimeout(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["tcp_keepalives_count"] = "7" // the connection string's own choice wins
	pgnet.BoundSilence(cfg)
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	want := map[string]string{"tcp_keepalives_idle": "20", "tcp_keepalives_interval": "5",
		"tcp_keepalives_count": "7", "tcp_user_timeout": "40000"}
	for name, value := range want {
		var got string
		if err := conn.QueryRow(t.Context(), "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != value {
			t.Errorf("server setting %s = %q, want %q", name, got, value)
		}
	}
	tcp, ok := conn.PgConn().Conn().(*net.TCPConn)
	if !ok {
		t.Fatalf("connection is a %T, want TCP (the test URL names 127.0.0.1)", conn.PgConn().Conn())
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var userTimeout, keepAlive int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		userTimeout, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if gerr == nil {
			keepAlive, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		}
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if userTimeout != 30000 || keepAlive != 1 {
		t.Errorf("socket TCP_USER_TIMEOUT = %d ms, SO_KEEPALIVE = %d; want 30000 ms and 1", userTimeout, keepAlive)
	}
}
