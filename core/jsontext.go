// Checks of JSON text that Go's decoder lets through, shared by emit lines
// (ParseEmit) and producers' messages (internal/msgjson): what one accepts,
// the other must too.

package core

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MemberProblem says what is wrong with the member names of the JSON object
// text that a decoder of known names would let through: unknown, a name not
// exactly one of names (Go's decoder matches names ignoring case, so
// "PAYLOAD" would be taken for "payload"), or twice, a name given twice (it
// keeps the last, so a misspelled duplicate could override a stage). Both
// are "" when the names are right. Text that is not one JSON object is the
// decoder's to refuse, and passes here.
func MemberProblem(text string, names ...string) (unknown, twice string) {
	d := json.NewDecoder(strings.NewReader(text))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return "", ""
	}
	var seen []string
	for d.More() {
		t, err := d.Token()
		name, ok := t.(string)
		if err != nil || !ok {
			return "", ""
		}
		if !slices.Contains(names, name) {
			return name, ""
		}
		if slices.Contains(seen, name) {
			return "", name
		}
		seen = append(seen, name)
		var skip json.RawMessage
		if d.Decode(&skip) != nil {
			return "", ""
		}
	}
	return "", ""
}

// MembersError is MemberProblem's finding as the error that refuses text:
// `unknown field "X" (WANT)`, with "; names are matched exactly" inside the
// parentheses when X is one of names but for case, or `field "X" given
// twice`; nil when the names are right. want says which fields are taken.
func MembersError(text, want string, names ...string) error {
	unknown, twice := MemberProblem(text, names...)
	switch {
	case unknown != "" && slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, unknown) }):
		return fmt.Errorf("unknown field %q (%s; names are matched exactly)", unknown, want)
	case unknown != "":
		return fmt.Errorf("unknown field %q (%s)", unknown, want)
	case twice != "":
		return fmt.Errorf("field %q given twice", twice)
	}
	return nil
}

// StringRefuses says why raw, one JSON string literal quotes and all, does
// not stand for a string of UTF-8 text, or "" when it does: bytes that are
// not UTF-8, or a lone UTF-16 surrogate escape. Go's decoder replaces either
// with U+FFFD without an error, which would change a payload silently.
func StringRefuses(raw string) string {
	if !utf8.ValidString(raw) {
		return "bytes that are not UTF-8"
	}
	for i := 0; i+1 < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] != 'u' {
			continue
		}
		_, end, lone := uEscape(raw, i)
		if lone {
			return "a lone UTF-16 surrogate in a string"
		}
		i = end
	}
	return ""
}

// uEscape reads the \u escape whose 'u' is at p[i], in valid JSON: its code
// unit r, the index of its last byte (of the pair's second half, for a
// surrogate pair), and whether it is a lone UTF-16 surrogate.
func uEscape(p string, i int) (r uint64, end int, lone bool) {
	r, _ = strconv.ParseUint(p[i+1:i+5], 16, 32)
	end = i + 4
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return r, end, true
	case r >= 0xD800 && r <= 0xDBFF:
		if end+6 >= len(p) || p[end+1] != '\\' || p[end+2] != 'u' {
			return r, end, true
		}
		lo, _ := strconv.ParseUint(p[end+3:end+7], 16, 32)
		if lo < 0xDC00 || lo > 0xDFFF {
			return r, end, true
		}
		return r, end + 6, false
	}
	return r, end, false
}
