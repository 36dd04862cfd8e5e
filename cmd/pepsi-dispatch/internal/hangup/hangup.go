// Package hangup catches SIGHUP for pepsi-dispatch from the start of its
// package initialization, which it alone imports for that. Until a Go
// program asks for SIGHUP, the runtime's answer to it is to exit at once
// (status 129 to a shell): no shutdown, no requeue, nothing flushed. A
// signal.Notify in main comes after every imported package's
// initialization, several milliseconds of OpenTelemetry, gRPC, pgx and
// Prometheus on a loaded machine, in which a closed terminal or a service
// manager's reload sent just after the start killed it. Go initializes a
// package as soon as its imports are, the first by import path among those
// ready: this one needs only os/signal, and is initialized right after it.
//
// Nothing can be earlier: between exec and the runtime's installing its
// handlers (well under a millisecond) the kernel's default applies and
// SIGHUP still ends the process. Only a process started with SIGHUP
// ignored (nohup) is safe from its first instruction.
package hangup

import (
	"os"
	"os/signal"
	"syscall"
)

// C delivers the process's SIGHUPs, from its package initialization to its
// exit (it is never stopped): its reader logs them (dispatch.WarnHangups),
// and one it has not read yet waits in C. It is nil when the process was
// started with SIGHUP ignored: it stays ignored, in the workers too, which
// a handler would have given the default back at exec.
var C <-chan os.Signal

func init() {
	if signal.Ignored(syscall.SIGHUP) {
		return
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	C = c
}
