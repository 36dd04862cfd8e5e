package main

import (
	"strconv"
	"strings"
	"unicode"
)

// Text a producer or a stage chose (an order key, an idempotency key, a
// stage's or an operator's reason) may hold any character but \u0000: a line
// break, a tab, an escape sequence. Printed as it is, it broke the table it
// stood in (an order key's line break made a row of its own, named by the
// rest of the key) and reached the operator's terminal as its commands (a
// key holding "\x1b[2J" cleared the screen). pepsi-queue prints such
// characters escaped, as Go writes them in a string ("\n", "\x1b").

// printable is s with each control character (C0, DEL, C1) and each other
// character that is not printable escaped as Go writes it in a string, the
// rest as it is: for free text, a reason or a detail.
func printable(s string) string {
	if !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unprintable(r) {
			q := strconv.QuoteRune(r) // '\n', '\x1b', '\u0085'
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// printableKey is key as it is, or, when it holds a character printable
// escapes (or begins with a quote, which would read as one such), quoted
// as a Go string: a key is matched exactly (pepsi-queue list -order-key),
// so its printed form must tell it from every other key.
func printableKey(key string) string {
	if !strings.ContainsFunc(key, unprintable) && !strings.HasPrefix(key, `"`) {
		return key
	}
	return strconv.Quote(key)
}

// unprintable says whether r must be escaped: a control character, or one
// Go does not count as printable (a format character, an unassigned one),
// a space (U+0020) excepted. A replacement character (invalid UTF-8 in the
// text) is printable.
func unprintable(r rune) bool {
	return r != ' ' && !unicode.IsPrint(r)
}
