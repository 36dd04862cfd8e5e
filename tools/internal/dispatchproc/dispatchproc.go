// Package dispatchproc is the one way the development programs (pepsi-demo,
// pepsi-bench, pepsi-chaos, pepsi-soak) run a pepsi-dispatch process: find the
// binary, start it on a configuration with its log in a file of its own and
// without the caller's PEPSI_* variables, watch it exit, stop it with SIGTERM.
//
// It never builds a configuration (each program's pipeline is its own) and is
// never imported by cmd/: an operator's programs start no dispatcher.
package dispatchproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Name is the dispatcher's program name.
const Name = "pepsi-dispatch"

// Find returns the pepsi-dispatch binary to run: given (a -dispatch flag) when
// it is not "", else the one beside the running program (make build puts them
// all in bin/), else the one on PATH.
func Find(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return "", fmt.Errorf("find %s: %w", Name, err)
	}
	beside := filepath.Join(filepath.Dir(self), Name)
	if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return beside, nil
	}
	if p, err := exec.LookPath(Name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s is neither beside %s nor on PATH: run \"make build\" (or name it with -dispatch)", Name, self)
}

// Config says how to start one dispatcher.
type Config struct {
	Binary string   // the pepsi-dispatch binary (Find)
	Conf   string   // its pepsi.conf, passed as -c
	Args   []string // more flags, after -c CONF
	Log    string   // the file its standard output and error go to (created afresh)
	// Env is added to its environment, which is otherwise this program's
	// without the PEPSI_* variables: the dispatcher must read its database from
	// the configuration, and a PEPSI_DATABASE naming the caller's server would
	// override it.
	Env []string
	// Drop names more prefixes of this program's variables it must not see
	// (pepsi-chaos drops PG*, so that libpq's defaults do not bypass its proxy).
	Drop []string
}

// Process is one running (or exited) pepsi-dispatch.
type Process struct {
	Cmd  *exec.Cmd // Cmd.Process is the dispatcher's
	Log  string    // Config.Log
	done chan struct{}
}

// Start starts the dispatcher c describes; it runs until it exits or is
// stopped, whatever becomes of the caller's context.
func Start(c Config) (*Process, error) {
	logFile, err := os.Create(c.Log)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", Name, err)
	}
	cmd := exec.Command(c.Binary, append([]string{"-c", c.Conf}, c.Args...)...)
	cmd.Env = append(environment(os.Environ(), append([]string{"PEPSI_"}, c.Drop...)), c.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", c.Binary, err)
	}
	p := &Process{Cmd: cmd, Log: c.Log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // a non-zero exit is read from ProcessState by whoever waits
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// environment is env without the variables whose names begin with one of drop.
func environment(env, drop []string) []string {
	var out []string
next:
	for _, kv := range env {
		for _, prefix := range drop {
			if strings.HasPrefix(kv, prefix) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// Pid is the dispatcher's process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the dispatcher has exited and its log is closed.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode is the dispatcher's exit status once Done is closed (-1 for a
// signal), and -1 before.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Stop sends SIGTERM and returns the exit status; a dispatcher still running
// after wait is killed, and that is an error.
func (p *Process) Stop(wait time.Duration) (int, error) {
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return -1, fmt.Errorf("signal %s: %w", Name, err)
	}
	select {
	case <-p.done:
		return p.ExitCode(), nil
	case <-time.After(wait):
		p.Kill()
		return -1, fmt.Errorf("%s did not exit within %v of SIGTERM; killed it", Name, wait)
	}
}

// Kill sends SIGKILL (if it still runs) and waits for the dispatcher to exit.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill() // it may have exited already: then there is nothing to kill
	<-p.done
}

// CPU is the user and system time of the exited dispatcher and of the workers
// it reaped (wait4 reports both); 0 before it exits.
func (p *Process) CPU() time.Duration {
	select {
	case <-p.done:
		st := p.Cmd.ProcessState
		return st.UserTime() + st.SystemTime()
	default:
		return 0
	}
}

// LogTail is the last n lines of the dispatcher's log, headed by its file
// name, for error messages.
func (p *Process) LogTail(n int) string {
	text, err := os.ReadFile(p.Log)
	if err != nil || len(text) == 0 {
		return "(" + Name + " logged nothing)"
	}
	lines := strings.Split(strings.TrimRight(string(text), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- the end of " + Name + "'s log (" + p.Log + ") ---\n" + strings.Join(lines, "\n")
}
