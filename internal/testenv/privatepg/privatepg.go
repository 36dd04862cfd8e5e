// Package privatepg runs a PostgreSQL server of its own, in a temporary
// directory on a free port of 127.0.0.1, so a test or pepsi-chaos may crash and
// restart it without disturbing a shared server. It needs the server's
// programs (initdb, pg_ctl: Debian's postgresql package); as root, the server
// runs as user postgres, since initdb refuses to run as root.
package privatepg

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
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/store"
)

// Server is one private PostgreSQL.
type Server struct {
	bin  string // directory of initdb, pg_ctl, postgres
	dir  string // owned by the server's user: data/, the socket, the log
	port int
	asPG bool
}

// BinDir finds the server programs: pg_config --bindir, else the newest
// /usr/lib/postgresql/*/bin.
func BinDir() (string, error) {
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

// Start initdbs a server into a temporary directory and starts it. Stop ends
// it and removes the directory.
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, asPG: os.Geteuid() == 0}
	if s.dir, err = os.MkdirTemp("", "pepsi-private-pg-"); err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(s.dir)
		return nil, err
	}
	if s.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, the private server needs user postgres: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	data := filepath.Join(s.dir, "data")
	if err := s.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		return fail(err)
	}
	if err := s.run("pg_ctl", "-D", data, "-l", s.LogFile(), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=60", s.port, s.dir), "start"); err != nil {
		return fail(err)
	}
	return s, nil
}

func (s *Server) command(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, prog)
	if s.asPG {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (s *Server) run(prog string, args ...string) error {
	if out, err := s.command(prog, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %q: %w\n%s", prog, args, err, out)
	}
	return nil
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// URL is the server's postgres database.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// LogFile is the server's log.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "log") }

// Migrate applies the PEPSI schema to the postgres database.
func (s *Server) Migrate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return fmt.Errorf("connect to the private PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := store.Migrate(ctx, conn); err != nil {
		return fmt.Errorf("migrate the private PostgreSQL: %w", err)
	}
	return nil
}

// Restart restarts the server with pg_ctl's shutdown mode ("immediate" is a
// crash: recovery runs, and commits not yet flushed are lost). It returns once
// the server accepts connections again (pg_ctl -w).
func (s *Server) Restart(mode string) error {
	return s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-l", s.LogFile(), "-m", mode, "-w", "-t", "60", "restart")
}

// Stop stops the server (immediate) and removes its directory.
func (s *Server) Stop() error {
	err := s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(s.dir)
	return err
}
