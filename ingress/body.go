package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"

	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
)

// Content types of a request body.
const (
	ContentJSON   = "application/json"
	ContentNDJSON = "application/x-ndjson"
)

// Limits bound what one request may hold.
type Limits struct {
	// Body is the most bytes of a body (MAX_BODY): more is 413.
	Body int64
	// Line is the most bytes of one NDJSON line (one message): more is 413.
	Line int
	// Messages is the most messages in one body: more is 413.
	Messages int
}

// Status is an answer other than 202, with the reason the client reads.
type Status struct {
	// Code is the HTTP status code.
	Code int
	// Msg is one line for the client (and the log); it never holds a payload.
	Msg string
	// RetryAfter, in seconds, is sent as Retry-After when positive.
	RetryAfter int
}

func (s *Status) Error() string { return fmt.Sprintf("%d %s", s.Code, s.Msg) }

func statusf(code int, format string, args ...any) *Status {
	return &Status{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// fields are the fields a message over HTTP may have.
var fields = msgjson.Fields{Stage: true, Key: true, OrderKey: true, TraceParent: true, NotBefore: true, Limit: true}

// ParseBody reads a request body of contentType (its media type decides JSON or
// NDJSON) into messages, each with its stage: its own "stage" field, else
// stageParam (the ?stage= of the request). known says whether a stage is
// configured. It answers the whole body or a Status naming the bad line:
// nothing of a body with one bad line may be inserted. A stageParam that is
// not configured is refused before r is read (stageParamStatus).
func ParseBody(r io.Reader, contentType, stageParam string, lim Limits, known func(string) bool) ([]msgjson.Message, *Status) {
	if st := stageParamStatus(stageParam, known); st != nil {
		return nil, st
	}
	mt, st := mediaType([]byte(contentType))
	if st != nil {
		return nil, st
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, readStatus(err, lim)
	}
	return parseBody(body, mt, stageParam, lim, known)
}

// mediaType is ContentJSON or ContentNDJSON, whichever contentType says, or
// a 415.
func mediaType(contentType []byte) (string, *Status) {
	switch string(contentType) { // the plain spellings need no parsing
	case ContentJSON:
		return ContentJSON, nil
	case ContentNDJSON:
		return ContentNDJSON, nil
	}
	mt, _, err := mime.ParseMediaType(string(contentType))
	if err != nil || (mt != ContentJSON && mt != ContentNDJSON) {
		return "", statusf(http.StatusUnsupportedMediaType, "Content-Type %q: want %s (one message) or %s (one message per line)", contentType, ContentJSON, ContentNDJSON)
	}
	return mt, nil
}

// encodingStatus refuses a body with a Content-Encoding (contentEncoding,
// empty for none) other than identity: the body is read as it comes, never
// decompressed, so a gzip body was refused as malformed JSON (a 400 about
// the byte 0x1f) and a body sent uncompressed under a gzip header was taken.
// 415 is RFC 9110's answer to a content coding the server does not take.
func encodingStatus(contentEncoding []byte) *Status {
	if ce := bytes.TrimSpace(contentEncoding); len(ce) == 0 || bytes.EqualFold(ce, []byte("identity")) {
		return nil
	}
	return statusf(http.StatusUnsupportedMediaType, "Content-Encoding %q: send the body uncompressed (no Content-Encoding, or identity)", clip(string(contentEncoding)))
}

// stageParamStatus refuses a ?stage= (stageParam, "" for none) that names
// no configured stage, or answers nil. It is refused even when every message
// has a stage of its own: a typo in the URL is the producer's mistake to hear
// of at once, not when a message without its own stage first comes. And it
// is checked before the body is read: whatever the body holds, the request
// cannot succeed, and an answer about the body would have the producer mend
// the body and send it again to the same wrong URL.
func stageParamStatus(stageParam string, known func(string) bool) *Status {
	if stageParam != "" && !known(stageParam) {
		return statusf(http.StatusBadRequest, "?stage=: stage %q is not configured", clip(stageParam))
	}
	return nil
}

// parseBody is ParseBody of a body read whole, of media type mt, whose
// stageParam has passed stageParamStatus.
func parseBody(body []byte, mt, stageParam string, lim Limits, known func(string) bool) ([]msgjson.Message, *Status) {
	var msgs []msgjson.Message
	var keys map[string]int // key -> line it first appeared on; made at the first key
	add := func(line int, text []byte) *Status {
		where := "body"
		if mt == ContentNDJSON {
			where = fmt.Sprintf("line %d", line)
		}
		if len(msgs) == lim.Messages {
			return statusf(http.StatusRequestEntityTooLarge, "%s: more than %d messages in one request", where, lim.Messages)
		}
		m, err := msgjson.Parse(text, fields)
		if err != nil {
			if mt == ContentJSON && bytes.HasPrefix(bytes.TrimLeft(text, " \t\r\n"), []byte("[")) {
				return statusf(http.StatusBadRequest, "%s: %v: send one message as a JSON object, or several as NDJSON (Content-Type: application/x-ndjson, one object per line)", where, err)
			}
			return statusf(http.StatusBadRequest, "%s: %v", where, err)
		}
		if m.Stage == "" {
			m.Stage = stageParam
		}
		switch {
		case m.Stage == "":
			return statusf(http.StatusBadRequest, "%s: no stage (give \"stage\" or ?stage=)", where)
		case !known(m.Stage):
			return statusf(http.StatusBadRequest, "%s: stage %q is not configured", where, clip(m.Stage))
		}
		if m.Key != "" {
			if first, dup := keys[m.Key]; dup {
				return statusf(http.StatusBadRequest, "%s: key %q already given on line %d of this request", where, clip(m.Key), first)
			}
			if keys == nil {
				keys = map[string]int{}
			}
			keys[m.Key] = line
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		msgs = append(msgs, m)
		return nil
	}
	if mt == ContentJSON {
		if len(body) > lim.Line {
			return nil, statusf(http.StatusRequestEntityTooLarge, "body: the message is longer than %d bytes", lim.Line)
		}
		if st := add(1, body); st != nil {
			return nil, st
		}
		return msgs, nil
	}
	line := 0
	for rest := body; len(rest) > 0; {
		line++
		text, after, _ := bytes.Cut(rest, []byte("\n"))
		rest = after
		if len(text) > lim.Line {
			return nil, statusf(http.StatusRequestEntityTooLarge, "line %d is longer than %d bytes", line, lim.Line)
		}
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		if st := add(line, text); st != nil {
			return nil, st
		}
	}
	if len(msgs) == 0 {
		return nil, statusf(http.StatusBadRequest, "no messages in the body")
	}
	return msgs, nil
}

// readStatus says why reading a body failed: too large, too slow, or cut off.
func readStatus(err error, lim Limits) *Status {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return statusf(http.StatusRequestEntityTooLarge, "body is larger than %d bytes (MAX_BODY)", lim.Body)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return statusf(http.StatusRequestTimeout, "body not received in time")
	}
	return statusf(http.StatusBadRequest, "body cut off: %v", err)
}

// clip shortens a client's string for an error message.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
