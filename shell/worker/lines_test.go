package worker

import (
	"strings"
	"testing"
)

// TestALineOfExactlyAnswerMaxBytesIsWhole: the protocol allows a line of
// core.AnswerMax bytes (the stage library writes such emit lines), with "\n"
// or "\r\n"; one byte more is cut, whether a newline ends it or the output
// does, and the line after it is read whole; only a last line without a
// newline is unterminated.
func TestALineOfExactlyAnswerMaxBytesIsWhole(t *testing.T) {
	most, over := strings.Repeat("x", lineMax), strings.Repeat("y", lineMax+1)
	for _, tc := range []struct {
		name, in string
		want     []string
		cut      []bool
		last     bool // the last line is unterminated
	}{
		{"lineMax and \\n", most + "\nnext\n", []string{most, "next"}, []bool{false, false}, false},
		{"lineMax and \\r\\n", most + "\r\nnext\n", []string{most, "next"}, []bool{false, false}, false},
		{"lineMax at the end", most, []string{most}, []bool{false}, true},
		{"one more and \\n", over + "\nnext\n", []string{over[:lineMax], "next"}, []bool{true, false}, false},
		{"one more and \\r\\n", over + "\r\nnext\n", []string{over[:lineMax], "next"}, []bool{true, false}, false},
		{"one more at the end", over, []string{over[:lineMax]}, []bool{true}, true},
		{"a line and a tail", "0 >done\n0 >b", []string{"0 >done", "0 >b"}, []bool{false, false}, true},
	} {
		var lines []string
		var cuts, ends []bool
		err := readLines(strings.NewReader(tc.in), func(line string, cut, unterminated bool) {
			lines, cuts, ends = append(lines, line), append(cuts, cut), append(ends, unterminated)
		})
		ok := err == nil && len(lines) == len(tc.want)
		for i := 0; ok && i < len(lines); i++ {
			ok = lines[i] == tc.want[i] && cuts[i] == tc.cut[i] && ends[i] == (tc.last && i == len(lines)-1)
		}
		if !ok {
			lens := make([]int, len(lines))
			for i, l := range lines {
				lens[i] = len(l)
			}
			t.Errorf("%s: lines of %v bytes, cut %v, %v; want %d lines, cut %v", tc.name, lens, cuts, err, len(tc.want), tc.cut)
		}
	}
}
