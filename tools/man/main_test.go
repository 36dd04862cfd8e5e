package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
		// A table wider than the terminal, or a table cell troff cannot
		// justify, is the reader's width, not the page's fault (pepsi-httpd(8)'s
		// metric tables at 80 columns).
		widthOnly := regexp.MustCompile(`(?m)^warning: file '[^']*', around line \d+:\n\s+table wider than line width\n|^troff: <standard input>:\d+: warning \[[^\]]*\]: cannot adjust line\n`)
		if warn := widthOnly.ReplaceAllString(stderr.String(), ""); warn != "" {
			t.Errorf("man -l %s warns: %s", path, warn)
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
