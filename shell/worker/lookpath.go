package worker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// lookPath resolves program as the protocol says, on PATH unless absolute: an
// absolute path is used as it is, a name without a slash is searched in the
// directories of path (the PATH of the workers' environment, so the program
// found is the one the environment names). A stage program must not depend on
// the dispatcher's working directory, so, unlike execvp(3), a relative path
// with a slash ("sub/prog") is refused (the configuration already refuses it,
// core/conf; this holds for any other caller), and relative directories in
// path (including the empty entry, meaning ".") are skipped, as exec.LookPath
// refuses them with exec.ErrDot. The error says what was looked for, where,
// and why it failed.
func lookPath(program, path string) (string, error) {
	if program == "" {
		return "", fmt.Errorf("program name is empty")
	}
	if strings.Contains(program, "/") {
		if !filepath.IsAbs(program) {
			return "", fmt.Errorf("program %s is a relative path: a path must be absolute (a bare name is looked up on PATH)", conf.Quote(program))
		}
		if err := checkExecutable(program); err != nil {
			return "", fmt.Errorf("program %s: %w", conf.Quote(program), err)
		}
		return program, nil
	}
	var firstErr error
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		candidate := filepath.Join(dir, program)
		err := checkExecutable(candidate)
		if err == nil {
			return candidate, nil
		}
		if firstErr == nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			// Found but unusable: keep looking (a later directory may hold a
			// good one), and report this if none does.
			firstErr = fmt.Errorf("program %s found as %s but %w", conf.Quote(program), candidate, err)
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", fmt.Errorf("program %s not found in PATH %s", conf.Quote(program), conf.Quote(path))
}

// checkExecutable reports why file cannot be executed, if it visibly cannot: it
// does not exist, is a directory, has no execute bit, or this process may not
// execute it (the kernel's own check, mayExecute: a program installed by root
// with mode 0700, or on a noexec mount, while the dispatcher runs as a
// service user). Anything subtler (a missing interpreter, a wrong
// architecture) is reported by the exec itself.
func checkExecutable(file string) error {
	fi, err := os.Stat(file)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("is a directory")
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("is not executable (mode %v)", fi.Mode().Perm())
	}
	if err := mayExecute(file); err != nil {
		return fmt.Errorf("may not be executed by this user (mode %v, owner uid %d): %w", fi.Mode().Perm(), owner(fi), err)
	}
	return checkInterpreter(file)
}

// checkInterpreter reports why the interpreter a script's "#!" line names
// cannot be run, if it visibly cannot: the kernel's exec then fails with
// ENOENT, which reads as if the script itself were missing. A line ended
// by CR LF names an interpreter with a carriage return at its end, the
// usual cause. A file that is no script, or unreadable, or an interpreter
// named by a relative path (the kernel takes it from the working
// directory), passes: the exec says what is wrong.
func checkInterpreter(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	line, _, _ := bytes.Cut(head[:n], []byte("\n"))
	rest, ok := bytes.CutPrefix(line, []byte("#!"))
	if !ok {
		return nil
	}
	fields := bytes.FieldsFunc(rest, func(r rune) bool { return r == ' ' || r == '\t' })
	if len(fields) == 0 {
		return fmt.Errorf("has an empty #! line")
	}
	interp := string(fields[0])
	if strings.HasSuffix(interp, "\r") {
		return fmt.Errorf("has a #! line ending in a carriage return (CR LF line ends): the interpreter it names is %s", conf.Quote(interp))
	}
	if !filepath.IsAbs(interp) {
		return nil // the kernel takes it from the working directory: the exec says
	}
	if err := mayExecute(interp); err != nil {
		return fmt.Errorf("names the interpreter %s on its #! line, which cannot be run: %w", conf.Quote(interp), err)
	}
	return nil
}

// owner is the uid that owns the file fi describes, for an error message.
func owner(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Uid)
	}
	return -1
}
