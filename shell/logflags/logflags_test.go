package logflags_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/logflags"
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
