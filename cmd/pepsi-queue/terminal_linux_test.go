package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// openPTY returns the terminal side of a new pseudo-terminal.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the pty's terminal: %v", err)
	}
	t.Cleanup(func() { pts.Close() })
	return pts
}

func TestIsTerminalOnlyForATerminal(t *testing.T) {
	t.Parallel()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, tc := range []struct {
		name string
		f    *os.File
		want bool
	}{
		{"/dev/null, a character device", null, false},
		{"a pipe", r, false},
		{"a pseudo-terminal", openPTY(t), true},
	} {
		if got := isTerminal(tc.f); got != tc.want {
			t.Errorf("isTerminal(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if isTerminal(strings.NewReader("")) {
		t.Error("isTerminal(a strings.Reader) = true, want false")
	}
}

func TestEnqueueFromDevNullSaysItReadNothing(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, pepsi.Path(t), "-database", url, "enqueue", "-stage", "x")
	var stdout, stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, &stdout, &stderr
	err = cmd.Run()
	if err != nil || stderr.Len() != 0 || stdout.String() != "read no messages from standard input (it was empty or blank): 0 enqueued\n" {
		t.Errorf("enqueue < /dev/null: %v, stdout %q, stderr %q; want exit 0, no word of a terminal, and that it read no messages", err, stdout.String(), stderr.String())
	}
}
