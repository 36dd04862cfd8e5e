package dispatch_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestWorkersUseTheDispatchersDatabase: pepsi-dispatch -database (or its
// PEPSI_DATABASE) overrides the file's [pepsi] DATABASE, and its workers,
// which read the same file, get that database too (PEPSI_DATABASE in their
// environment): they work on the messages they are handed, not on another
// database's rows of the same ids.
func TestWorkersUseTheDispatchersDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	other := pgtest.NewMigrated(t)
	text, err := os.ReadFile(e.conf)
	if err != nil {
		t.Fatal(err)
	}
	// The file names another database; the dispatcher is told e's (as by -database).
	if err := os.WriteFile(e.conf, []byte(strings.Replace(string(text), "DATABASE = "+e.url, "DATABASE = "+other, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ids := e.insert("a", "a=done", "a=done", "a=done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 3})
	d.stopClean()
	for _, id := range ids {
		e.expectRow(id, "done", "a", "")
	}
}
