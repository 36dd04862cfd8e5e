// Package bearer reads a tokens file (one bearer token per line, blank lines
// and # comments ignored) and checks an Authorization header against it in
// constant time: the TOKENS_FILE of pepsi-ingress and of pepsi-httpd's
// actions. It must never keep or log a token in clear: it holds only their
// SHA-256 digests.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// TokenMin is the shortest token a tokens file may hold: shorter ones can be
// guessed.
const TokenMin = 16

// Tokens are the bearer tokens of a TOKENS_FILE: one per line, blank lines and
// lines starting with # ignored, blanks around a token removed, each of
// TokenMin or more visible ASCII characters. They are kept as SHA-256 digests
// and compared in constant time, so neither the comparison's time nor a
// memory dump of a shorter token tells how much of one was right.
type Tokens struct {
	file string
	set  atomic.Pointer[[][sha256.Size]byte]
}

// LoadTokens reads file; it must hold at least one token.
func LoadTokens(file string) (*Tokens, error) {
	t := &Tokens{file: file}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the file again and returns how many tokens it holds. On an
// error the tokens in use stay as they were.
func (t *Tokens) Reload() (int, error) {
	text, err := os.ReadFile(t.file)
	if err != nil {
		return 0, fmt.Errorf("tokens: %w", err)
	}
	set, err := parseTokens(string(text))
	if err != nil {
		return 0, fmt.Errorf("tokens: %s:%w", t.file, err)
	}
	t.set.Store(&set)
	return len(set), nil
}

func parseTokens(text string) ([][sha256.Size]byte, error) {
	var set [][sha256.Size]byte
	for i, line := range strings.Split(text, "\n") {
		tok := strings.TrimSpace(line)
		if tok == "" || tok[0] == '#' {
			continue
		}
		if len(tok) < TokenMin {
			return nil, fmt.Errorf("%d: a token must be at least %d characters long", i+1, TokenMin)
		}
		for _, c := range []byte(tok) {
			if c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("%d: a token is visible ASCII characters, without blanks", i+1)
			}
		}
		set = append(set, sha256.Sum256([]byte(tok)))
	}
	if len(set) == 0 {
		return nil, errors.New(" no tokens (want one per line)")
	}
	return set, nil
}

// Allow reports whether header, an Authorization header's value, is
// "Bearer TOKEN" with one of the tokens. It looks at every token whatever
// matches, so its time does not tell which one did.
func (t *Tokens) Allow(header string) bool {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return t.Valid(tok)
}

// Valid reports whether tok (blanks around it ignored) is one of the tokens,
// in the constant time Allow takes.
func (t *Tokens) Valid(tok string) bool {
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for _, s := range *t.set.Load() {
		match |= subtle.ConstantTimeCompare(sum[:], s[:])
	}
	return match == 1
}
