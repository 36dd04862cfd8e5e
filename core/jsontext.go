// Checks of JSON text that Go's decoder lets through, shared by emit lines
// (ParseEmit) and producers' messages (internal/msgjson): what one accepts,
// the other must too.

package core

import (
	"encoding/json"
	"errors"
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
func MemberProblem[T ~string | ~[]byte](text T, names ...string) (unknown, twice string) {
	// A scan of the top level only, not a decoder: it leaves every value
	// unread and checks no syntax (MembersError leaves that to the
	// decoder); it allocates for a name written with escapes, and for each
	// name of bytes.
	i := skipWS(text, 0)
	if i >= len(text) || text[i] != '{' {
		return "", ""
	}
	var seen []string
	for i = skipWS(text, i+1); i < len(text) && text[i] == '"'; i = skipWS(text, i+1) {
		end := stringEnd(text, i)
		if end < 0 {
			return "", ""
		}
		name := string(text[i+1 : end-1])
		if strings.IndexByte(name, '\\') >= 0 {
			var s string
			if json.Unmarshal([]byte(text[i:end]), &s) != nil {
				return "", "" // the decoder says what is wrong
			}
			name = s
		}
		switch {
		case !slices.Contains(names, name):
			return name, ""
		case slices.Contains(seen, name):
			return "", name
		}
		seen = append(seen, name)
		if i = skipWS(text, end); i >= len(text) || text[i] != ':' {
			return "", ""
		}
		if i = skipWS(text, valueEnd(text, skipWS(text, i+1))); i >= len(text) || text[i] != ',' {
			return "", "" // the object's end, or text the decoder refuses
		}
	}
	return "", ""
}

// skipWS is the index of the first byte at or after i that is not JSON
// white space.
func skipWS[T ~string | ~[]byte](text T, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index after the JSON string that starts at text[i] (a
// '"'), or -1 when it does not end.
func stringEnd[T ~string | ~[]byte](text T, i int) int {
	for j := i + 1; j < len(text); j++ {
		switch text[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd is the index after the JSON value that starts at text[i], found
// by its brackets and strings alone (the decoder checks the rest), or
// len(text) when it does not end.
func valueEnd[T ~string | ~[]byte](text T, i int) int {
	depth := 0
	for ; i < len(text); i++ {
		switch c := text[i]; c {
		case '"':
			if i = stringEnd(text, i); i < 0 {
				return len(text)
			}
			i--
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		if depth == 0 && (text[i] == '"' || text[i] == '}' || text[i] == ']') {
			return i + 1
		}
	}
	return len(text)
}

// TrailerError refuses what follows the JSON object d has just decoded
// from text, if anything but white space does: nothing may. d.More alone
// would let a stray '}' or ']' through: it reports only whether another
// value follows. quote shows the rest in the error, as the caller's other
// errors quote.
func TrailerError[T ~string | ~[]byte](d *json.Decoder, text T, quote func(rest T) string) error {
	i := skipWS(text, int(d.InputOffset()))
	if i == len(text) {
		return nil
	}
	if d.More() {
		return errors.New("more than one JSON value on the line")
	}
	return fmt.Errorf("%s after the JSON object", quote(text[i:]))
}

// MembersError is MemberProblem's finding as the error that refuses text:
// `unknown field "X" (WANT)`, with "; names are matched exactly" inside the
// parentheses when X is one of names but for case, or `field "X" given
// twice`; nil when the names are right. want says which fields are taken.
func MembersError[T ~string | ~[]byte](text T, want string, names ...string) error {
	unknown, twice := MemberProblem(text, names...)
	if (unknown != "" || twice != "") && !json.Valid([]byte(text)) {
		return nil // the scan reads names, not syntax: the decoder says what is wrong
	}
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
func StringRefuses[T ~string | ~[]byte](raw T) string {
	if !validUTF8(raw) {
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
func uEscape[T ~string | ~[]byte](p T, i int) (r uint64, end int, lone bool) {
	r, _ = strconv.ParseUint(string(p[i+1:i+5]), 16, 32)
	end = i + 4
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return r, end, true
	case r >= 0xD800 && r <= 0xDBFF:
		if end+6 >= len(p) || p[end+1] != '\\' || p[end+2] != 'u' {
			return r, end, true
		}
		lo, _ := strconv.ParseUint(string(p[end+3:end+7]), 16, 32)
		if lo < 0xDC00 || lo > 0xDFFF {
			return r, end, true
		}
		return r, end + 6, false
	}
	return r, end, false
}

// validUTF8 is utf8.Valid of text, a string or bytes, without copying it.
func validUTF8[T ~string | ~[]byte](text T) bool {
	for i := 0; i < len(text); {
		if text[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(string(text[i:min(i+utf8.UTFMax, len(text))]))
		if r == utf8.RuneError && n == 1 {
			return false
		}
		i += n
	}
	return true
}
