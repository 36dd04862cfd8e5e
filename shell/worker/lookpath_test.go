package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stageDir writes an executable "stage" into a new directory and returns
// the directory.
func stageDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "stage"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// relToCwd is path relative to the test's working directory.
func relToCwd(t *testing.T, path string) string {
	t.Helper()
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(cwd, path)
	if err != nil || filepath.IsAbs(rel) {
		t.Fatalf("expected a relative path from %s to %s, got %q (%v)", cwd, path, rel, err)
	}
	return rel
}

func TestLookPathSkipsRelativePATHEntries(t *testing.T) {
	t.Parallel()
	dir := stageDir(t)
	rel := relToCwd(t, dir)
	if got, err := lookPath("stage", rel); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("expected the relative PATH entry %q skipped and stage not found, got %q, %v", rel, got, err)
	}
	if got, err := lookPath("stage", rel+":"+dir); err != nil || got != filepath.Join(dir, "stage") {
		t.Fatalf("expected %s from the absolute entry, got %q, %v", filepath.Join(dir, "stage"), got, err)
	}
}

func TestLookPathPrefersALaterExecutableOverAnEarlierUnusableOne(t *testing.T) {
	t.Parallel()
	bad, good := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "stage"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(good, "stage"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := lookPath("stage", bad+":"+good); err != nil || got != filepath.Join(good, "stage") {
		t.Fatalf("expected %s, got %q, %v", filepath.Join(good, "stage"), got, err)
	}
}

// Proves: a relative path with a slash is refused whatever the working
// directory holds, rather than started relative to it: the protocol looks a
// program up on PATH unless it is absolute.
func TestLookPathRefusesARelativePathWithASlash(t *testing.T) {
	t.Parallel()
	dir := stageDir(t)
	rel := relToCwd(t, filepath.Join(dir, "stage"))
	for _, program := range []string{rel, "./" + rel} {
		got, err := lookPath(program, dir)
		if err == nil || !strings.Contains(err.Error(), "is a relative path: a path must be absolute") {
			t.Errorf("lookPath(%q): got %q, %v; want it refused as a relative path", program, got, err)
		}
	}
	if got, err := lookPath(filepath.Join(dir, "stage"), ""); err != nil || got != filepath.Join(dir, "stage") {
		t.Errorf("expected the absolute path used as it is, got %q, %v", got, err)
	}
}

// A script whose #! line names an interpreter that cannot be run (missing,
// or with a carriage return from CR LF line ends) fails the check with a
// reason naming the interpreter: the exec would fail with ENOENT, as if the
// script itself were missing.
func TestCheckNamesAScriptsInterpreterThatCannotRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, c := range map[string]struct{ text, want string }{
		"missing":  {"#!/nonexistent/interp -x\nexit 0\n", "names the interpreter '/nonexistent/interp' on its #! line, which cannot be run"},
		"crlf":     {"#!/bin/sh\r\nexit 0\r\n", "has a #! line ending in a carriage return (CR LF line ends)"},
		"relative": {"#! sh\nexit 0\n", ""}, // taken from the working directory, as the kernel does
		"good":     {"#! /bin/sh -e\nexit 0\n", ""},
		"binary":   {"\x7fELF", ""},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(c.text), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := lookPath(p, "")
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v; want it to pass", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v; want %q", name, err, c.want)
		}
	}
}
