package main

import (
	"errors"
	"fmt"
	"go/scanner"
	"go/token"
	"strings"
	"unicode"
)

// A patch is found by its Go tokens, not its bytes: layout and comments do not
// matter, and a local name in it (a variable, a parameter, the receiver) matches
// any name the core uses in its place, consistently (one name for one name both
// ways). So a mutant survives gofmt, a reworded comment and a renamed local
// variable; it goes stale only when the code it breaks changes shape: another
// operator, literal, field, method, exported name or builtin. The new text is
// written with the core's names for the locals it shares with the old.

// tok is one token of Go source: its kind, its text (for names and literals),
// its byte span, and whether it follows a period (a field or method name,
// matched exactly).
type tok struct {
	t        token.Token
	lit      string
	from, to int
	sel      bool
}

// scan splits src into tokens; a patch that is not whole tokens (it starts or
// ends inside a string literal, say) is an error.
func scan(src string) ([]tok, error) {
	fset := token.NewFileSet()
	file := fset.AddFile("patch", fset.Base(), len(src))
	var errs []string
	var s scanner.Scanner
	s.Init(file, []byte(src), func(pos token.Position, msg string) {
		errs = append(errs, fmt.Sprintf("%d:%d: %s", pos.Line, pos.Column, msg))
	}, 0)
	var out []tok
	for {
		pos, t, lit := s.Scan()
		if t == token.EOF {
			break
		}
		from := file.Offset(pos)
		if t == token.SEMICOLON && lit == "\n" && from == len(src) {
			break // inserted at the end of the text, not at a newline in it
		}
		text := lit
		if text == "" || t == token.SEMICOLON {
			text = t.String()
			if lit == "\n" {
				text = "" // a semicolon the scanner inserted at a newline
			}
		}
		out = append(out, tok{t: t, lit: lit, from: from, to: from + len(text), sel: len(out) > 0 && out[len(out)-1].t == token.PERIOD})
	}
	if len(errs) > 0 {
		return nil, errors.New("not whole Go tokens: " + strings.Join(errs, "; "))
	}
	return out, nil
}

// builtins are the predeclared names, matched exactly.
var builtins = map[string]bool{
	"append": true, "cap": true, "clear": true, "close": true, "complex": true, "copy": true, "delete": true,
	"imag": true, "len": true, "make": true, "max": true, "min": true, "new": true, "panic": true, "print": true,
	"println": true, "real": true, "recover": true, "true": true, "false": true, "nil": true, "iota": true, "_": true,
	"any": true, "bool": true, "byte": true, "error": true, "int": true, "int64": true, "string": true, "rune": true,
	"float64": true, "uint64": true,
}

// local reports whether a name may stand for another: a lower-case name that
// is no field or method (after a period) and not predeclared.
func local(k tok) bool {
	if k.t != token.IDENT || k.sel || builtins[k.lit] {
		return false
	}
	r := []rune(k.lit)[0]
	return unicode.IsLower(r)
}

// renaming maps the pattern's local names to the source's, one to one.
type renaming struct{ to, from map[string]string }

func newRenaming() renaming { return renaming{to: map[string]string{}, from: map[string]string{}} }

// bind matches pattern token p with source token s under r, extending r.
func (r renaming) bind(p, s tok) bool {
	if p.t != s.t || p.sel != s.sel {
		return false
	}
	switch {
	case p.t == token.SEMICOLON:
		return true
	case local(p) && local(s):
		if got, ok := r.to[p.lit]; ok {
			return got == s.lit
		}
		if _, taken := r.from[s.lit]; taken {
			return false
		}
		r.to[p.lit], r.from[s.lit] = s.lit, p.lit
		return true
	}
	return p.lit == s.lit
}

// match is one place a pattern matches: the byte span in the source and the
// renaming that made it match.
type match struct {
	from, to int
	names    renaming
}

// find returns every place the tokens of pattern match src.
func find(pattern []tok, src []tok) []match {
	var out []match
	for i := 0; i+len(pattern) <= len(src); i++ {
		r := newRenaming()
		ok := true
		for j := range pattern {
			if !r.bind(pattern[j], src[i+j]) {
				ok = false
				break
			}
		}
		if ok {
			last := src[i+len(pattern)-1]
			out = append(out, match{from: src[i].from, to: last.to, names: r})
		}
	}
	return out
}

// rename writes text with its local names replaced by the source's, where
// the old text's renaming has them.
func rename(text string, names renaming) (string, error) {
	toks, err := scan(text)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	at := 0
	for _, k := range toks {
		if to, ok := names.to[k.lit]; ok && local(k) {
			b.WriteString(text[at:k.from])
			b.WriteString(to)
			at = k.to
		}
	}
	b.WriteString(text[at:])
	return b.String(), nil
}
