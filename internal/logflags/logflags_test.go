package logflags_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/logflags"
)

func TestNewWritesTheFormatAtTheLevelAndNamesABadFlag(t *testing.T) {
	var b bytes.Buffer
	log, err := logflags.New(&b, "json", "warn", nil)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil || line["msg"] != "shown" || strings.Contains(b.String(), "hidden") {
		t.Errorf("json at warn wrote %q (%v)", b.String(), err)
	}
	if _, err := logflags.New(&b, "xml", "info", nil); err == nil || !strings.Contains(err.Error(), "-log-format") {
		t.Errorf("a bad format: %v, want an error naming -log-format", err)
	}
	if _, err := logflags.New(&b, "text", "loud", nil); err == nil || !strings.Contains(err.Error(), "-log-level") {
		t.Errorf("a bad level: %v, want an error naming -log-level", err)
	}
}

func TestNewNamesTheSettingAsTheCallerKnowsIt(t *testing.T) {
	env := func(flag string) string { return "PEPSI_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }
	if _, err := logflags.New(io.Discard, "xml", "info", env); err == nil || err.Error() != `PEPSI_LOG_FORMAT "xml": want text or json` {
		t.Errorf("a bad format from the environment: %v, want an error naming PEPSI_LOG_FORMAT", err)
	}
	if _, err := logflags.New(io.Discard, "text", "loud", env); err == nil || err.Error() != `PEPSI_LOG_LEVEL "loud": want debug, info, warn or error` {
		t.Errorf("a bad level from the environment: %v, want an error naming PEPSI_LOG_LEVEL", err)
	}
}

// A connection error lists each address tried on a line of its own: in the log
// it is one line, in either format, and a refusal repeated is said once.
func TestAnErrorThatSpansLinesIsOneLineOfTheLog(t *testing.T) {
	err := errors.New("failed to connect to `user=x database=y`:\n\t127.0.0.1:1 (127.0.0.1): dial error: connection refused\n\t127.0.0.1:1 (127.0.0.1): dial error: connection refused")
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		log, lerr := logflags.New(&b, format, "info", nil)
		if lerr != nil {
			t.Fatal(lerr)
		}
		log.Error("cannot reach the database", "err", err, "detail", "a\nb")
		line := b.String()
		if strings.Count(line, "\n") != 1 || strings.Contains(line, `\n`) || strings.Contains(line, `\t`) {
			t.Errorf("%s: %q; want one line without escaped newlines or tabs", format, line)
		}
		if strings.Count(line, "connection refused") != 1 {
			t.Errorf("%s: %q; want the refusal said once", format, line)
		}
	}
}
