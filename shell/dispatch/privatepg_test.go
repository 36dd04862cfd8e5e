package dispatch_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/shell/schema"
)

// privatePG is a PostgreSQL server of one test's own, so the test may crash and
// restart it without disturbing the shared server the other tests use.
type privatePG struct {
	bin  string // directory of initdb, pg_ctl, postgres
	dir  string // owned by the server's user: data/, the socket, the log
	port int
	asPG bool // run the server's programs as user postgres (we are root)
}

// pgBinDir finds the server programs: pg_config --bindir, else the newest
// /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	var tried []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		tried = append(tried, strings.TrimSpace(string(out)))
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	tried = append(tried, dirs...)
	for _, d := range tried {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("no initdb and pg_ctl in %q: install the PostgreSQL server (Debian package postgresql)", tried)
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// startPrivatePostgres initdbs a server into a temporary directory, starts it on
// a free port of 127.0.0.1, and stops and removes it when the test ends. As root
// (initdb refuses to run as root) the server runs as user postgres.
func startPrivatePostgres(t *testing.T) *privatePG {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Fatal(err)
	}
	pg := &privatePG{bin: bin, asPG: os.Geteuid() == 0}
	dir, err := os.MkdirTemp("", "pepsi-private-pg-")
	if err != nil {
		t.Fatal(err)
	}
	pg.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if pg.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the private server needs user postgres (Debian package postgresql creates it): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pg.port = l.Addr().(*net.TCPAddr).Port
	l.Close()

	data := filepath.Join(dir, "data")
	pg.run(t, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	pg.run(t, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=60", pg.port, dir), "start")
	t.Cleanup(func() {
		if out, err := pg.command("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
			t.Errorf("stop the private PostgreSQL: %v\n%s", err, out)
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "log")); err == nil {
				t.Logf("private PostgreSQL log:\n%s", b)
			}
		}
	})
	return pg
}

func (pg *privatePG) command(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(pg.bin, prog)
	if pg.asPG {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (pg *privatePG) run(t *testing.T, prog string, args ...string) {
	t.Helper()
	if out, err := pg.command(prog, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", prog, args, err, out)
	}
}

// url is the server's postgres database.
func (pg *privatePG) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pg.port)
}

// migrated applies the PEPSI schema to the postgres database and returns its URL.
func (pg *privatePG) migrated(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.url())
	if err != nil {
		t.Fatalf("connect to the private PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := schema.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate the private PostgreSQL: %v", err)
	}
	return pg.url()
}

// restart restarts the server with pg_ctl's shutdown mode ("immediate" is a
// crash: recovery runs, and commits not yet flushed are lost).
func (pg *privatePG) restart(t *testing.T, mode string) {
	t.Helper()
	start := time.Now()
	pg.run(t, "pg_ctl", "-D", filepath.Join(pg.dir, "data"), "-l", filepath.Join(pg.dir, "log"), "-m", mode, "-w", "-t", "60", "restart")
	t.Logf("pg_ctl restart -m %s took %v", mode, time.Since(start).Round(time.Millisecond))
}
