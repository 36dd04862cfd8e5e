package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestAFlagAfterTheIDSaysWhereItGoes: "show 42 -payload" and "history 42
// -json" (the flag package stops at the id) say that the flag goes before
// the id, not only that two arguments were given; an argument that is no
// flag of the command is still counted.
func TestAFlagAfterTheIDSaysWhereItGoes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "42", "-payload"}, "pepsi-queue show: -payload is given after the message id: put it before (pepsi-queue show -payload 42)\n"},
		{[]string{"history", "42", "--json=true"}, "pepsi-queue history: --json=true is given after the message id: put it before (pepsi-queue history --json=true 42)\n"},
		{[]string{"show", "42", "-json"}, "pepsi-queue show: want exactly one message id, got 2 arguments\n"},
		{[]string{"history", "42", "43"}, "pepsi-queue history: want exactly one message id, got 2 arguments\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"-database", "postgres://127.0.0.1:1/none"}, tc.args...), strings.NewReader(""), &stdout, &stderr)
		if code != exitUsage || !strings.HasPrefix(stderr.String(), tc.want) {
			t.Errorf("pepsi-queue %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), code, stderr.String(), tc.want)
		}
	}
}
