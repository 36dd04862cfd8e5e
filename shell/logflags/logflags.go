// Package logflags turns the -log-format and -log-level flags that every
// long-running PEPSI program takes into its log/slog logger, so that they mean
// the same in each. It only builds the logger; it never writes a line itself.
package logflags

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a logger writing to w in format ("text" or "json") at level
// ("debug", "info", "warn" or "error"), or an error naming the bad setting as
// name calls it (cliflags.Parsed.Name: the flag, or the environment variable that
// set it); a nil name says -log-format and -log-level.
func New(w io.Writer, format, level string, name func(flag string) string) (*slog.Logger, error) {
	if name == nil {
		name = func(flag string) string { return "-" + flag }
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%s %q: want debug, info, warn or error", name("log-level"), level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%s %q: want text or json", name("log-format"), format)
}
