// Package progrun runs a program for a test the way an operator or the
// dispatcher would: with its standard input given, the test's environment
// less the variables it must not inherit, and what it printed and its exit
// status back. It is test infrastructure; no program of the product uses it.
package progrun

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// Params is one run of a program.
type Params struct {
	Path  string
	Args  []string
	Stdin string
	// Env is added to the test's environment, from which every variable
	// whose name begins with one of Drop is removed first.
	Env  []string
	Drop []string
	// Timeout bounds the run: the program is killed after it.
	Timeout time.Duration
}

// Result is what one run did.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs p and returns what the program did. It fails t if the program
// could not be run at all; a non-zero exit is a Result.
func Run(t testing.TB, p Params) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.Path, p.Args...)
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(p.Drop, func(prefix string) bool { return strings.HasPrefix(kv, prefix) }) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, p.Env...)
	cmd.Stdin = strings.NewReader(p.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %s %q: %v", p.Path, p.Args, err)
	}
	return Result{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}
}
