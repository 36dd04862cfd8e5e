// Package cliflags parses the command line of a PEPSI program the same way in
// each: the flags, then (with an environment prefix) a PREFIX_NAME variable for
// each flag the command line did not give, as ff/v3 reads them. A mistake is one
// line and a pointer to -h, not the whole help: the help buries the one line
// that says what is wrong.
package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/peterbourgon/ff/v3"
)

// ExitUsage is the exit status of a bad command line, in every PEPSI program.
const ExitUsage = 2

// Parse parses args into fs, then, when envPrefix is not empty, the environment:
// -max-runtime from PREFIX_MAX_RUNTIME unless the command line gave it. Asked for
// help (-h, -help), it prints fs.Usage to fs.Output() and returns flag.ErrHelp;
// for any other mistake it prints nothing and returns the error, one line for
// Fail.
func Parse(fs *flag.FlagSet, args []string, envPrefix string) error {
	// The flag package prints its error and then the whole usage: keep both for
	// -h alone.
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	var opts []ff.Option
	if envPrefix != "" {
		opts = append(opts, ff.WithEnvVarPrefix(envPrefix))
	}
	err := ff.Parse(fs, args, opts...)
	fs.Usage = usage
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		return flag.ErrHelp
	}
	if err != nil {
		// ff prefixes "error parsing commandline arguments: ", which says nothing more.
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return err
	}
	return nil
}

// Fail reports err, a mistake on the command line of prog, as one line and a
// pointer to the help, and returns the exit status: 0 for flag.ErrHelp (the
// help is printed already), else ExitUsage.
func Fail(w io.Writer, prog string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(w, "%s: %v\nRun '%s -h' for help.\n", prog, err, prog)
	return ExitUsage
}
