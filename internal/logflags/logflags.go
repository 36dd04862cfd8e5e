// Package logflags turns the -log-format and -log-level flags that every
// long-running PEPSI program takes into its log/slog logger, so that they mean
// the same in each. It only builds the logger; it never writes a line itself.
package logflags

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
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
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: OneLineAttr}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%s %q: want text or json", name("log-format"), format)
}

// OneLineAttr folds every string or error value that spans lines (a
// connection error that lists each address tried) into one line, so that one
// record is one line of the log in either format. It is a
// slog.HandlerOptions.ReplaceAttr, for loggers built elsewhere (the stage
// library's).
func OneLineAttr(_ []string, a slog.Attr) slog.Attr {
	switch v := a.Value; v.Kind() {
	case slog.KindString:
		if strings.ContainsRune(v.String(), '\n') {
			a.Value = slog.StringValue(OneLine(v.String()))
		}
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && strings.ContainsRune(err.Error(), '\n') {
			a.Value = slog.StringValue(OneLine(err.Error()))
		}
	}
	return a
}

// OneLine folds a text that spans lines into one line, "; " between its
// lines, and says a part once where a later line repeats the end of an
// earlier one (the same refusal for a connection tried with and without TLS).
func OneLine(s string) string {
	s = strings.NewReplacer(":\n\t", ": ", "\n\t", "; ", "\n", "; ").Replace(strings.TrimSpace(s))
	var kept []string
	for _, p := range strings.Split(s, "; ") {
		if !slices.ContainsFunc(kept, func(k string) bool { return strings.HasSuffix(k, p) }) {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "; ")
}
