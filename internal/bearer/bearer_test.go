package bearer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/bearer"
)

func TestTokensAreReadOnePerLineAndReloaded(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	write := func(text string) {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# producer A\n  token-of-producer-a  \n\ntoken-of-producer-b\n")
	tok, err := bearer.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]bool{
		"Bearer token-of-producer-a": true, "bearer token-of-producer-b": true, "Bearer  token-of-producer-a": true,
		"Bearer token-of-producer-c": false, "Bearer token-of-producer-": false, "token-of-producer-a": false,
		"Basic token-of-producer-a": false, "Bearer # producer A": false, "": false,
	} {
		if got := tok.Allow(header); got != want {
			t.Errorf("Allow(%q) = %v, want %v", header, got, want)
		}
	}
	write("token-of-producer-c\n")
	if n, err := tok.Reload(); err != nil || n != 1 {
		t.Fatalf("Reload: %d, %v; want 1 token", n, err)
	}
	if tok.Allow("Bearer token-of-producer-a") || !tok.Allow("Bearer token-of-producer-c") {
		t.Errorf("after Reload the old token still works or the new one does not")
	}
	for text, want := range map[string]string{
		"# nothing\n": "no tokens",
		"short\n":     ":1: a token must be at least 16 characters long",
		"ok-token-0123456789\nwith blank inside x\n": ":2: a token is visible ASCII characters",
	} {
		write(text)
		if _, err := tok.Reload(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Reload of %q: %v; want an error containing %q", text, err, want)
		}
		if !tok.Allow("Bearer token-of-producer-c") {
			t.Errorf("a failed Reload dropped the tokens in use")
		}
	}
	if _, err := bearer.LoadTokens(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("LoadTokens of a missing file succeeded")
	}
}
