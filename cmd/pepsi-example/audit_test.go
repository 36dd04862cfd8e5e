package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
)

// auditScript is the demo's last stage, a stage program in plain sh.
const auditScript = "../../testdata/stages/audit.sh"

// runAudit runs the audit script as pepsi-dispatch would, with stdin as its input.
func runAudit(t *testing.T, stdin string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, auditScript, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %s: %v", auditScript, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

func TestAuditScriptFinishesItsRowsAndLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ctx := context.Background()
	_, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, state) VALUES
		('audit', 'running', '{"k": 1}'), ('audit', 'running', '{}'), ('deliver', 'running', '{}'),
		('audit', 'pending', '{}'), ('audit', 'running', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(conf, []byte("# demo\n[pepsi-dispatch]\nMAX_RUNTIME = 5\n[pepsi]\n  DATABASE = "+url+"  \n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The last id has no newline: it still counts.
	code, stdout, stderr := runAudit(t, "1\n2\n3\n4\nnope\n\n5", []string{"PEPSI_STAGE=audit"}, "worker", "-c", conf)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q; want 0 at the end of input", code, stderr)
	}
	if want := "0\n0\n0\n0\n1 not a message id: nope\n0\n"; stdout != want {
		t.Errorf("stdout %q, want %q (one line per id, in order)", stdout, want)
	}
	var got string
	err = conn.QueryRow(ctx, `SELECT string_agg(ingress_id || ':' || stage || ':' || status || ':' || (state ? 'audited_at') || ':' || coalesce(state->>'k', '-'), ' ' ORDER BY ingress_id) FROM pepsi.queue`).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	if want := "1:audit:done:true:1 2:audit:done:true:- 3:deliver:running:false:- 4:audit:pending:false:- 5:audit:done:true:-"; got != want {
		t.Errorf("rows = %s, want %s (only rows running at audit are finished; the rest of the state kept)", got, want)
	}
}

func TestAuditScriptAnswersNonZeroWhenTheStatementFails(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t) // no schema: every UPDATE fails
	code, stdout, stderr := runAudit(t, "1\n2\n", []string{"PEPSI_STAGE=audit", "PEPSI_DATABASE=" + url}, "worker")
	want := "1 audit: relation \"pepsi.queue\" does not exist\n"
	if code != 0 || stdout != want+want {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 0 and two lines %q", code, stdout, stderr, want)
	}
}

func TestAuditScriptRefusesABadStart(t *testing.T) {
	t.Parallel()
	if code, _, stderr := runAudit(t, "", []string{"PEPSI_STAGE=audit"}); code != 2 || !strings.Contains(stderr, "usage:") {
		t.Errorf("no arguments: exit %d, stderr %q; want 2 and a usage", code, stderr)
	}
	if code, stdout, stderr := runAudit(t, "1\n", nil, "worker"); code != 2 || stdout != "" || !strings.Contains(stderr, "PEPSI_STAGE is not set") {
		t.Errorf("no PEPSI_STAGE: exit %d, stdout %q, stderr %q; want 2, no answer, the reason", code, stdout, stderr)
	}
	code, stdout, _ := runAudit(t, "1\n", []string{"PEPSI_STAGE=audit", "PEPSI_DATABASE=postgres://postgres@127.0.0.1:1/none"}, "worker")
	if code == 0 || stdout != "" {
		t.Errorf("unreachable database: exit %d, stdout %q; want non-zero and no answer", code, stdout)
	}
}
