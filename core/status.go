package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// reasonMax bounds a failure reason written to state.dispatch_error.
const reasonMax = 2000

// Bounds of an answered transition (docs/protocol.md).
const (
	// PauseMax is the longest pause a stage may answer (paused:SECONDS).
	PauseMax = 10 * 365 * 24 * time.Hour
	// patchMax bounds a state patch, in bytes.
	patchMax = 1 << 20
	// numberMax bounds the length of one number in a state patch: a longer
	// one is refused whatever its value (NumericRefuses says which shorter
	// ones PostgreSQL's numeric cannot hold).
	numberMax = 100
)

// The limits of PostgreSQL's numeric, as its input function checks them
// (value overflows numeric format, SQLSTATE 22003): at most numericScaleMax
// digits after the decimal point as written (trailing zeros and a negative
// exponent count), the first nonzero digit at most numericWeightMax places
// before it, and an exponent below numericExponentMax (INT_MAX / 2), for a
// zero too.
const (
	numericScaleMax    = 16383
	numericWeightMax   = 131071
	numericExponentMax = 1<<30 - 1
)

// The targets of an answered transition other than a stage name.
const (
	// TargetDone finishes the message: status done.
	TargetDone = conf.ReservedDone
	// TargetPaused pauses the message at the stage that answered, until a
	// timeout (written paused:SECONDS).
	TargetPaused = conf.ReservedPaused
)

// Status is a parsed worker status line.
type Status struct {
	// Code is 0 for success; anything else means the message failed.
	Code int
	// Reason is the text after a non-zero code (may be empty).
	Reason string
	// Fused lists stages fused into a successful pass, in the order given.
	Fused []Fused
	// Transition is what a stage answered instead of writing it ("0
	// >TARGET…"); nil for a bare "0", whose stage wrote its own transition.
	Transition *Transition
}

// Transition is a transition a stage answered for the dispatcher to write.
type Transition struct {
	// To is a stage name (the message becomes pending there), TargetDone or
	// TargetPaused.
	To string
	// PauseFor is how long a TargetPaused message waits.
	PauseFor time.Duration
	// Patch is a compact JSON object merged into state (state || patch) in the
	// same write, or "".
	Patch string
	// Invalid, when not empty, says why the dispatcher cannot write this
	// transition (a target or patch that is malformed): the message fails with it
	// as the reason, and the worker lives on.
	Invalid string
}

// Fused is one stage fused into another stage's pass and the time it took.
type Fused struct {
	Stage  string
	Micros int64
}

// ParseStatus parses one status line of the worker protocol: "0",
// "0 STAGE:MICROS…", "0 >TARGET[ STAGE:MICROS…][ {JSON}]" or "N REASON…" with N
// a non-zero integer; the 0 is that one digit ("00" and "-0" are not it).
// Anything else is an error quoting the line; the dispatcher
// treats it as a protocol error. An answered transition whose target or patch is
// malformed is not a protocol error: it parses, with Transition.Invalid saying
// why, and fails only its message.
//
// In the answer form, the first word after the target that is not STAGE:MICROS
// starts the patch (the rest of the line) when it can only be an attempt at one:
// it begins with '{', '[' or '"', or it is a JSON number, true, false or null.
// Any other such word ("0 >b tag") is a protocol error, as in the bare form.
func ParseStatus(line string) (Status, error) {
	head, rest, _ := strings.Cut(line, " ")
	code, err := strconv.Atoi(head)
	if err != nil || head == "" || head[0] == '+' {
		return Status{}, fmt.Errorf("status line %s does not start with an integer code", conf.Quote(clip(line, 200)))
	}
	if code == 0 && head != "0" {
		// Success is the line "0" (docs/protocol.md): a "-0" or "00" is a
		// stage that printed a number it did not mean, not an answer.
		return Status{}, fmt.Errorf("status line %s: success is written 0, not %s", conf.Quote(clip(line, 200)), conf.Quote(clip(head, 20)))
	}
	if code != 0 {
		return Status{Code: code, Reason: clip(StorableText(strings.TrimSpace(rest)), reasonMax)}, nil
	}
	var s Status
	if strings.HasPrefix(rest, ">") {
		var target string
		target, rest, _ = strings.Cut(rest[1:], " ")
		s.Transition = parseTarget(target)
	}
	for rest != "" {
		var f string
		if f, rest, _ = strings.Cut(rest, " "); f == "" {
			continue // runs of spaces, as strings.Fields takes them
		}
		fused, ok, tooLarge := parseFused(f)
		if ok {
			s.Fused = append(s.Fused, fused)
			continue
		}
		if s.Transition != nil && attemptedPatch(f) {
			if s.Transition.Invalid == "" {
				patch := strings.TrimRight(f+" "+rest, " ")
				if why := checkPatch(patch); why != "" {
					s.Transition.Invalid = fmt.Sprintf("state patch %s refused: %s", conf.Quote(clip(patch, patchQuote)), why)
				} else {
					s.Transition.Patch = patch
				}
			}
			break
		}
		if tooLarge {
			return Status{}, fmt.Errorf("status line %s: %s reports more than %d microseconds (a year)", conf.Quote(clip(line, 200)), conf.Quote(clip(f, 100)), FusedMicrosMax)
		}
		return Status{}, fmt.Errorf("status line %s: %s is not STAGE:MICROS", conf.Quote(clip(line, 200)), conf.Quote(clip(f, 100)))
	}
	return s, nil
}

// Line writes s as the one status line ParseStatus reads back as s: "0",
// "0 STAGE:MICROS…", "0 >TARGET[ STAGE:MICROS…][ PATCH]" or "N[ REASON]". Every
// program that answers the dispatcher (the stage library, the simulator, the
// bench) writes its lines with it, so the grammar is written in one place.
//
// A pause is written in decimal seconds to the microsecond (PostgreSQL's
// resolution), without an exponent or trailing zeros; a negative one is 0. A
// newline in the reason becomes a space, since the reason ends the line. Line
// checks nothing else: stage names, the reason's length and the patch are the
// writer's (ParseStatus says what is wrong with them), and Transition.Invalid,
// which only ParseStatus sets, is not written.
func (s Status) Line() string {
	if s.Code != 0 {
		line := strconv.Itoa(s.Code)
		if s.Reason != "" {
			line += " " + strings.ReplaceAll(s.Reason, "\n", " ")
		}
		return line
	}
	var b strings.Builder
	b.WriteString("0")
	if t := s.Transition; t != nil {
		b.WriteString(" >")
		b.WriteString(t.To)
		if t.To == TargetPaused {
			b.WriteString(":")
			b.WriteString(pauseSeconds(t.PauseFor))
		}
	}
	for _, f := range s.Fused {
		b.WriteString(" ")
		b.WriteString(f.Stage)
		b.WriteString(":")
		b.WriteString(strconv.FormatInt(f.Micros, 10))
	}
	if t := s.Transition; t != nil && t.Patch != "" {
		b.WriteString(" ")
		b.WriteString(t.Patch)
	}
	return b.String()
}

// pauseSeconds writes d as the SECONDS of "paused:SECONDS": decimal seconds to
// the microsecond, without trailing zeros; a negative d is 0.
func pauseSeconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	us := d.Round(time.Microsecond).Microseconds()
	s := fmt.Sprintf("%d.%06d", us/1e6, us%1e6)
	return strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
}

// patchQuote is how much of a refused patch its message's reason quotes.
const patchQuote = 60

// FusedMicrosMax is the most microseconds one STAGE:MICROS may report: a
// year. The statistics add them up; a stage's absurd number must not run
// them past an int64.
const FusedMicrosMax = int64(365 * 24 * time.Hour / time.Microsecond)

// parseFused reads one STAGE:MICROS word. tooLarge: it is one but for
// MICROS above FusedMicrosMax, for the protocol error's text.
func parseFused(f string) (fused Fused, ok, tooLarge bool) {
	name, micros, found := strings.Cut(f, ":")
	if !found || !conf.ValidStageName(name) {
		return Fused{}, false, false
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && micros[0] != '-', err == nil && us > FusedMicrosMax:
		return Fused{}, false, true
	case err != nil || us < 0:
		return Fused{}, false, false
	}
	return Fused{Stage: name, Micros: us}, true, false
}

// attemptedPatch reports whether a word that is not STAGE:MICROS can only be
// the start of a JSON value, so the answer meant a patch: an object, array or
// string, or a whole number, true, false or null.
func attemptedPatch(f string) bool {
	return strings.ContainsRune("{[\"", rune(f[0])) || json.Valid([]byte(f))
}

// parseTarget reads TARGET of "0 >TARGET".
func parseTarget(t string) *Transition {
	switch {
	case t == TargetDone:
		return &Transition{To: TargetDone}
	case t == TargetPaused:
		return &Transition{Invalid: fmt.Sprintf("target %s needs a time: paused:SECONDS", conf.Quote(t))}
	case strings.HasPrefix(t, TargetPaused+":"):
		text := strings.TrimPrefix(t, TargetPaused+":")
		sec, err := strconv.ParseFloat(text, 64)
		if err != nil || math.IsNaN(sec) || sec < 0 || sec > PauseMax.Seconds() || strings.ContainsAny(text, "xXpP_eE+-") {
			return &Transition{Invalid: fmt.Sprintf("target %s: SECONDS must be a decimal number from 0 to %d", conf.Quote(clip(t, 100)), int64(PauseMax.Seconds()))}
		}
		return &Transition{To: TargetPaused, PauseFor: time.Duration(math.Round(sec*1e6)) * time.Microsecond}
	case conf.ValidStageName(t):
		return &Transition{To: t}
	}
	return &Transition{Invalid: fmt.Sprintf("target %s is not a stage name, done or paused:SECONDS", conf.Quote(clip(t, 100)))}
}

// checkPatch says why p cannot be merged into state by PostgreSQL's jsonb, or ""
// when it can: it must be one JSON object of at most patchMax bytes, nested
// at most jsonDepthMax deep, and jsonb refuses what JSON allows but it cannot
// store (JSONBRefuses); a number longer than numberMax is refused too. A patch the core let through
// and PostgreSQL refused would fail the whole transaction of the step, again
// and again.
func checkPatch(p string) string {
	switch {
	case len(p) > patchMax:
		return fmt.Sprintf("longer than %d bytes", patchMax)
	case !json.Valid([]byte(p)):
		return "not valid JSON"
	case !strings.HasPrefix(p, "{"):
		return "not a JSON object"
	case JSONDepth(p) > jsonDepthMax:
		return fmt.Sprintf("nested more than %d deep", jsonDepthMax)
	}
	return jsonbRefuses(p, numberMax)
}

// JSONBRefuses says why PostgreSQL's jsonb refuses text, valid JSON, or ""
// when it takes it: Go's JSON allows bytes that are not UTF-8, \u0000, a
// lone UTF-16 surrogate escape and numbers beyond the range of PostgreSQL's
// numeric (NumericRefuses), jsonb none of them. pepsi-ingress and pepsi-queue check a message's state with
// it, so that the refusal names the input line, not the INSERT.
func JSONBRefuses(text string) string { return jsonbRefuses(text, 0) }

// jsonbRefuses is JSONBRefuses, and with lengthMax above 0 it also refuses a
// number longer than that.
func jsonbRefuses(p string, lengthMax int) string {
	if !utf8.ValidString(p) {
		return "bytes that are not UTF-8"
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			// Strings: only escapes matter.
			for i++; i < len(p) && p[i] != '"'; i++ {
				if p[i] != '\\' {
					continue
				}
				i++
				if p[i] != 'u' {
					continue
				}
				r, end, lone := uEscape(p, i)
				switch {
				case r == 0:
					return `\u0000 in a string`
				case lone:
					return "a lone UTF-16 surrogate in a string"
				}
				i = end
			}
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(p) && strings.IndexByte("+-.eE0123456789", p[j]) >= 0 {
				j++
			}
			if lengthMax > 0 && j-i > lengthMax {
				return fmt.Sprintf("a number longer than %d characters", lengthMax)
			}
			if NumericRefuses(p[i:j]) {
				return fmt.Sprintf("the number %s, beyond the range of PostgreSQL's numeric", clip(p[i:j], 40))
			}
			i = j - 1
		}
	}
	return ""
}

// NumericRefuses says whether PostgreSQL's numeric input refuses n, a valid
// JSON number, as out of its range (numericScaleMax and its kin). JSON has
// no bound on an exponent, and numeric's are reached by short numbers
// (1e-20000), which a length bound alone lets through.
func NumericRefuses(n string) bool {
	mantissa, exp := strings.TrimPrefix(n, "-"), int64(0)
	if k := strings.IndexAny(mantissa, "eE"); k >= 0 {
		e, err := strconv.ParseInt(mantissa[k+1:], 10, 64)
		if err != nil || e >= numericExponentMax || e <= -numericExponentMax {
			return true
		}
		mantissa, exp = mantissa[:k], e
	}
	whole, frac, _ := strings.Cut(mantissa, ".")
	if int64(len(frac))-exp > numericScaleMax {
		return true
	}
	digits := whole + frac
	first := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	return first >= 0 && int64(len(whole)-1-first)+exp > numericWeightMax
}

// StorableText is s as PostgreSQL's text and jsonb can store it: each run
// of bytes that are not UTF-8, and each NUL, becomes U+FFFD. A reason is the
// stage's free text for an operator; refused by the database, it would fail
// the whole transaction of the step, again at every try.
func StorableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
