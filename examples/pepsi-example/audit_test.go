package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/progrun"
)

// auditScript is the demo's last stage, a stage program in plain sh.
const auditScript = "../../testdata/stages/audit.sh"

// runAudit runs the audit script as pepsi-dispatch would, with stdin as its input.
func runAudit(t *testing.T, stdin string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	r := progrun.Run(t, progrun.Params{Path: auditScript, Args: args, Stdin: stdin, Env: env,
		Drop: []string{"PEPSI_"}, Timeout: 30 * time.Second})
	return r.Code, r.Stdout, r.Stderr
}

// The script answers every id with the whole transition, for the dispatcher to
// write; it never connects to the database, so one that cannot be reached
// changes nothing.
func TestAuditScriptAnswersDoneWithItsPatchWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	// The last id has no newline: it still counts.
	code, stdout, stderr := runAudit(t, "1\n2\nnope\n\n3",
		[]string{"PEPSI_STAGE=audit", "PEPSI_DATABASE=postgres://postgres@127.0.0.1:1/none"}, "worker", "-c", "/nonexistent/pepsi.conf")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q; want 0 at the end of input", code, stderr)
	}
	done := `0 >done {"audited_by":"audit.sh"}` + "\n"
	if want := done + done + "1 not a message id: nope\n" + done; stdout != want {
		t.Errorf("stdout %q, want %q (one line per id, in order)", stdout, want)
	}
	if stderr != "" {
		t.Errorf("stderr %q, want nothing", stderr)
	}
}

func TestAuditScriptRefusesABadStart(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"serve"}, {"worker", "-x", "f"}, {"worker", "-c"}} {
		if code, stdout, stderr := runAudit(t, "1\n", []string{"PEPSI_STAGE=audit"}, args...); code != 2 || stdout != "" || !strings.Contains(stderr, "usage:") {
			t.Errorf("args %q: exit %d, stdout %q, stderr %q; want 2, no answer and a usage", args, code, stdout, stderr)
		}
	}
	if code, stdout, stderr := runAudit(t, "1\n", nil, "worker"); code != 2 || stdout != "" || !strings.Contains(stderr, "PEPSI_STAGE is not set") {
		t.Errorf("no PEPSI_STAGE: exit %d, stdout %q, stderr %q; want 2, no answer, the reason", code, stdout, stderr)
	}
	if code, stdout, _ := runAudit(t, "1\n", []string{"PEPSI_STAGE=a b"}, "worker"); code != 2 || stdout != "" {
		t.Errorf("PEPSI_STAGE with a space: exit %d, stdout %q; want 2 and no answer", code, stdout)
	}
}
