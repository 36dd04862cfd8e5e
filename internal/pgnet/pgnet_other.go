//go:build !linux

package pgnet

import "time"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist; keepalive
// and the lock check still bound a silent network there.
func setUserTimeout(fd uintptr, d time.Duration) error { return nil }
