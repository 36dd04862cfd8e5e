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
// ("debug", "info", "warn" or "error"), or an error naming the bad flag.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", format)
}
