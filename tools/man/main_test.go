package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// Every manual page in docs/ renders to roff with a .TH header and the
// sections a manual page must have, and man(1), where it is installed, reads it
// without a warning.
func TestEveryManualPageRenders(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.[1-8].md")
	if err != nil || len(pages) < 4 {
		t.Fatalf("manual pages found: %v (%v); want at least the four of pepsi-dispatch, pepsi-queue, pepsi-httpd and pepsi.conf", pages, err)
	}
	out := t.TempDir()
	for _, page := range pages {
		if err := renderFile(page, out); err != nil {
			t.Errorf("render %s: %v", page, err)
			continue
		}
		name, section, _ := pageName(filepath.Base(page))
		path := filepath.Join(out, "man"+section, name+"."+section)
		roff, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{".TH " + strings.ToUpper(name) + " " + section, ".SH NAME\n", ".SH SYNOPSIS\n", ".SH DESCRIPTION\n"} {
			if !bytes.Contains(roff, []byte(want)) {
				t.Errorf("%s: the roff has no %q", path, want)
			}
		}
		if _, err := exec.LookPath("man"); err != nil {
			continue // man(1) is not on every machine; the roff is checked above
		}
		cmd := exec.Command("man", "--warnings", "-l", path)
		cmd.Env = append(os.Environ(), "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		text, err := cmd.Output()
		if err != nil || !bytes.Contains(text, []byte("NAME")) {
			t.Errorf("man -l %s: %v, %d bytes, stderr %q", path, err, len(text), stderr.String())
		}
		// A table cell troff cannot justify in its narrow column is only
		// spacing; a table wider than the line is not tolerated.
		adjustOnly := regexp.MustCompile(`(?m)^troff: <standard input>:\d+: warning \[[^\]]*\]: cannot adjust line\n`)
		if warn := adjustOnly.ReplaceAllString(stderr.String(), ""); warn != "" {
			t.Errorf("man -l %s warns: %s", path, warn)
		}
		// Every table fits the 80 columns it was rendered for.
		for _, line := range strings.Split(string(text), "\n") {
			if strings.ContainsAny(line, "│┌└├") && utf8.RuneCountInString(line) > 80 {
				t.Errorf("man -l %s: a table line of %d columns, over 80: %q", path, utf8.RuneCountInString(line), line)
				break
			}
		}
	}
}

func TestAPageWithoutItsTitleIsRefused(t *testing.T) {
	if _, err := render("x", "1", []byte("# y(1)\n\n## NAME\n\nx\n")); err == nil {
		t.Error("a page titled y(1) rendered as x(1); want an error")
	}
	if _, err := render("x", "1", []byte("# x(1)\n\nno sections\n")); err == nil {
		t.Error("a page without ## NAME rendered; want an error")
	}
}
