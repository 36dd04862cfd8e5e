// Command man renders the manual pages kept as markdown in docs/ (NAME.N.md,
// N the section) into man(1)'s roff, one style for all, with go-md2man (the
// renderer Docker and Kubernetes use for theirs): `make man` writes them under
// bin/man/manN/, `make install` copies them where man finds them. It is a
// development tool: it reads and writes files, and never touches a database.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
)

func main() {
	docs := flag.String("docs", "docs", "the `DIR` holding NAME.N.md manual pages")
	out := flag.String("out", "bin/man", "the `DIR` to write manN/NAME.N into")
	flag.Parse()
	pages, err := filepath.Glob(filepath.Join(*docs, "*.[1-8].md"))
	if err == nil && len(pages) == 0 {
		err = fmt.Errorf("no NAME.N.md manual pages in %s", *docs)
	}
	for _, page := range pages {
		if err != nil {
			break
		}
		err = renderFile(page, *out)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "man: %v\n", err)
		os.Exit(1)
	}
}

// renderFile renders docs/NAME.N.md to out/manN/NAME.N.
func renderFile(page, out string) error {
	text, err := os.ReadFile(page)
	if err != nil {
		return err
	}
	name, section, err := pageName(filepath.Base(page))
	if err != nil {
		return err
	}
	roff, err := render(name, section, text)
	if err != nil {
		return fmt.Errorf("%s: %w", page, err)
	}
	dir := filepath.Join(out, "man"+section)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+"."+section), roff, 0o644)
}

var pageFile = regexp.MustCompile(`^(.+)\.([1-8])\.md$`)

// pageName reads NAME and section N from a file name NAME.N.md.
func pageName(base string) (name, section string, err error) {
	m := pageFile.FindStringSubmatch(base)
	if m == nil {
		return "", "", fmt.Errorf("%s: a manual page is named NAME.N.md", base)
	}
	return m[1], m[2], nil
}

// render turns one markdown page into roff. The markdown reads well on its own
// (a "# NAME(N)" title, "## NAME", "## SYNOPSIS", … sections); for man the
// title becomes the .TH header and each "##" section a .SH.
func render(name, section string, text []byte) ([]byte, error) {
	title, body, _ := bytes.Cut(text, []byte("\n"))
	if want := "# " + name + "(" + section + ")"; strings.TrimSpace(string(title)) != want {
		return nil, fmt.Errorf("the first line is %q, want %q", title, want)
	}
	if !bytes.Contains(body, []byte("\n## NAME\n")) {
		return nil, fmt.Errorf("no \"## NAME\" section")
	}
	var src bytes.Buffer
	fmt.Fprintf(&src, "%% %s %s \"\" \"PEPSI\" \"PEPSI Manual\"\n", strings.ToUpper(name), section)
	for _, line := range strings.SplitAfter(string(body), "\n") {
		if strings.HasPrefix(line, "##") {
			line = line[1:] // one level up: ## is .SH, ### is .SS
		}
		src.WriteString(line)
	}
	return fitTables(md2man.Render(src.Bytes())), nil
}
