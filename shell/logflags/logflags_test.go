package logflags_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/logflags"
)

func TestNewWritesTheFormatAtTheLevelAndNamesABadFlag(t *testing.T) {
	var b bytes.Buffer
	log, err := logflags.New(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil || line["msg"] != "shown" || strings.Contains(b.String(), "hidden") {
		t.Errorf("json at warn wrote %q (%v)", b.String(), err)
	}
	if _, err := logflags.New(&b, "xml", "info"); err == nil || !strings.Contains(err.Error(), "-log-format") {
		t.Errorf("a bad format: %v, want an error naming -log-format", err)
	}
	if _, err := logflags.New(&b, "text", "loud"); err == nil || !strings.Contains(err.Error(), "-log-level") {
		t.Errorf("a bad level: %v, want an error naming -log-level", err)
	}
}
