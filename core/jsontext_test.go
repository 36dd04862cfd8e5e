package core_test

import (
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: MemberProblem reads the top level's names only (the same names in
// nested objects, or inside strings, are values), exactly and once, an
// escaped name as what it stands for, and leaves text that is not one object
// to the decoder.
func TestMemberProblemReadsTheTopLevelNamesOnly(t *testing.T) {
	names := []string{"stage", "payload", "state"}
	for _, tc := range []struct{ text, unknown, twice string }{
		{`{"stage":"b","payload":"x"}`, "", ""},
		{` { "stage" : "b" , "state" : {"stage":1,"payload":[{"payload":2}]} , "payload" : "}\"{,\"stage\":" } `, "", ""},
		{`{"payload":[1,{"x":"]"}],"Stage":"b"}`, "Stage", ""},
		{`{"payload":1,"st\u0061ge":"a","stage":"b"}`, "", "stage"},
		{`{"payload":true,"payload":null}`, "", "payload"},
		{`{"extra":{"stage":1}}`, "extra", ""},
		{`[{"x":1}]`, "", ""},
		{`{"payload":"x"`, "", ""},
		{`{"payload":"x",}`, "", ""},
		{`{}`, "", ""},
	} {
		unknown, twice := core.MemberProblem(tc.text, names...)
		if unknown != tc.unknown || twice != tc.twice {
			t.Errorf("MemberProblem(%s) = %q, %q; want %q, %q", tc.text, unknown, twice, tc.unknown, tc.twice)
		}
		if u, w := core.MemberProblem([]byte(tc.text), names...); u != unknown || w != twice {
			t.Errorf("MemberProblem of %s as bytes = %q, %q; want as text", tc.text, u, w)
		}
	}
}
