// Package buildinfo says which PEPSI a program is, for its -version flag and
// for bug reports: the module version and the commit it was built from, as the
// Go toolchain recorded them in the binary. It reads only that record; it never
// touches files, the network or the database.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// commit is the source's commit as `make build` links it in (-ldflags -X), for
// builds whose toolchain records no version control (GOFLAGS=-buildvcs=false).
var commit string

// Version is the one line a PEPSI program prints for -version:
// "NAME (PEPSI) VERSION, commit REV of TIME[, modified], GOVERSION". A build
// outside a git checkout has no commit; a build without build information
// (a test binary built by some tools) says "unknown".
func Version(name string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (PEPSI) unknown version"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (PEPSI) %s", name, strings.Trim(bi.Main.Version, "()"))
	setting := map[string]string{}
	for _, s := range bi.Settings {
		setting[s.Key] = s.Value
	}
	if rev := setting["vcs.revision"]; rev == "" && commit != "" {
		fmt.Fprintf(&b, ", commit %s", commit)
	} else if rev != "" {
		fmt.Fprintf(&b, ", commit %.12s", rev)
		if t := setting["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " of %s", t)
		}
		if setting["vcs.modified"] == "true" {
			b.WriteString(", modified")
		}
	}
	fmt.Fprintf(&b, ", %s", bi.GoVersion)
	return b.String()
}
