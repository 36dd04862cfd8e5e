package main

import (
	"os"
	"strings"
	"testing"
)

// TestEveryMutantApplies: each mutant's patches match exactly once in the
// core as it is (make mutants checks the same before any campaign).
func TestEveryMutantApplies(t *testing.T) {
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	src, order, err := coreSources(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mutants {
		if _, err := mutate(m, src, order); err != nil {
			t.Errorf("%s: %v", m.name, err)
		}
	}
}

// TestPatchSurvivesRenamedLocal: a patch written against one spelling of the
// code applies to the same code with its locals renamed, laid out otherwise
// and commented, and writes the new text with the code's own names.
func TestPatchSurvivesRenamedLocal(t *testing.T) {
	m := mutant{name: "t", old: "return max(0, free-len(st.backlog))", new: "return max(0, free-len(st.backlog)+1)"}
	src := map[string][]byte{"x.go": []byte("package core\n\nfunc (c *Core) capacity(s *stage) int {\n\tspare := c.room(s) // what is left\n\treturn max(0,\n\t\tspare - len(s.backlog))\n}\n")}
	out, err := mutate(m, src, []string{"x.go"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out["x.go"]); !strings.Contains(got, "return max(0, spare-len(s.backlog)+1)") {
		t.Errorf("mutated:\n%s", got)
	}
	// A renamed field or another operator is another shape: no match.
	for _, other := range []string{"\treturn max(0, spare-len(s.queue))\n", "\treturn max(0, spare+len(s.backlog))\n", "\treturn min(0, spare-len(s.backlog))\n"} {
		src := map[string][]byte{"x.go": []byte("package core\n\nfunc f(s *stage, spare int) int {\n" + other + "}\n")}
		if _, err := mutate(m, src, []string{"x.go"}); err == nil {
			t.Errorf("the patch applied to %q", other)
		}
	}
	// One name for one name: two locals cannot both stand for the same one.
	m2 := mutant{name: "t2", old: "a < b", new: "a <= b"}
	src2 := map[string][]byte{"x.go": []byte("package core\n\nfunc f(x int) bool { return x < x }\n")}
	if _, err := mutate(m2, src2, []string{"x.go"}); err == nil {
		t.Error("a < b matched x < x")
	}
}
