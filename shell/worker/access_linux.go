package worker

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mayExecute asks the kernel whether this process may execute path, with
// its effective user, groups and capabilities, as exec would decide
// (faccessat2 with AT_EACCESS, which honours ACLs). Where faccessat2 is
// missing (Linux before 5.8, or a seccomp profile that refuses it with
// ENOSYS or EPERM) it asks access(2), which checks the real user and
// groups: the same for a dispatcher that is no setuid program, though a
// capability such as CAP_DAC_OVERRIDE granted to a non-root user is not
// counted then. x/sys's Faccessat is not used: there it falls back to the
// mode bits, ignoring ACLs.
func mayExecute(path string) error {
	fd := int64(unix.AT_FDCWD) // a negative descriptor, passed as the register holds it
	atFDCWD := uintptr(fd)
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_FACCESSAT2, atFDCWD, uintptr(unsafe.Pointer(p)), unix.X_OK, unix.AT_EACCESS, 0, 0)
	switch errno {
	case 0:
		return nil
	case unix.ENOSYS, unix.EPERM:
		return unix.Access(path, unix.X_OK)
	}
	return errno
}
