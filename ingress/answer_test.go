package ingress

import (
	"encoding/json"
	"testing"
)

// TestIDsAnswerIsWhatTheEncoderWrites checks that the 202 body, written by
// hand, is byte for byte what encoding/json's Encoder wrote before.
func TestIDsAnswerIsWhatTheEncoderWrites(t *testing.T) {
	for _, ids := range [][]int64{nil, {}, {1}, {17, 18, 19}, {9223372036854775807, 0, 42}} {
		want, err := json.Marshal(map[string][]int64{"ids": append([]int64{}, ids...)})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, '\n')
		if got := idsAnswer(ids); string(got) != string(want) {
			t.Errorf("idsAnswer(%v) = %q; want %q", ids, got, want)
		}
	}
}
