package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// serveFor runs pepsi-httpd with args (hup delivering its SIGHUPs) until the
// test ends, and returns the address it serves on and its standard error.
func serveFor(t *testing.T, hup <-chan os.Signal, args ...string) (string, *lockedbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr, done := make(chan string, 1), make(chan int, 1)
	stderr := &lockedbuf.Buffer{}
	go func() { done <- run(ctx, args, io.Discard, stderr, hup, func(a string) { addr <- a }) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return a, stderr
	case code := <-done:
		done <- code // for the cleanup, which waits for it
		t.Fatalf("pepsi-httpd exited %d before serving: %s", code, stderr.String())
		return "", nil
	}
}

// runFor runs pepsi-httpd with args and returns its exit code and stderr.
func runFor(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, args, io.Discard, &stderr, nil, func(string) { t.Errorf("pepsi-httpd %q started serving; want it to refuse", args) })
	return code, stderr.String()
}

func TestBadFlagsAndConfigurationAreOneLineAndExit2(t *testing.T) {
	t.Parallel()
	badConf := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(badConf, []byte("[pepsi]\nDATABSE = x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shortTokens := filepath.Join(t.TempDir(), "operators")
	actionsConf := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(shortTokens, []byte("too-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(actionsConf, []byte("[pepsi-httpd]\nACTIONS = on\nTOKENS_FILE = "+shortTokens+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-c", badConf}, "pepsi-httpd: configuration: " + badConf + ":2: "},
		{[]string{"-database", "postgres://%zz"}, "pepsi-httpd: database connection string: "},
		{[]string{"-c", actionsConf}, "pepsi-httpd: [pepsi-httpd] TOKENS_FILE: tokens: " + shortTokens + ":1: a token must be at least 16 characters long"},
	} {
		code, stderr := runFor(t, tc.args...)
		if code != exitUsage || !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("pepsi-httpd %q: exit %d, stderr %q; want exit 2 and one line starting %q", tc.args, code, stderr, tc.want)
		}
	}
}

// A mistake on the command line is one line and a pointer to -h, as in every
// PEPSI program (cliflags.Fail).
func TestFlagMistakesPointToTheHelp(t *testing.T) {
	t.Parallel()
	hint := "\nRun 'pepsi-httpd -h' for help.\n"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bogus"}, "pepsi-httpd: flag provided but not defined: -bogus" + hint},
		{[]string{"extra"}, `pepsi-httpd: unexpected arguments ["extra"]` + hint},
		{[]string{"-listen", "localhost"}, `pepsi-httpd: -listen "localhost": address localhost: missing port in address` + hint},
		{[]string{"-cache", "0s"}, "pepsi-httpd: -cache 0s: must be positive" + hint},
		{[]string{"-history", "0"}, "pepsi-httpd: -history 0: want 1 to 100000" + hint},
		{[]string{"-log-format", "xml"}, `pepsi-httpd: -log-format "xml": want text or json` + hint},
	} {
		code, stderr := runFor(t, tc.args...)
		if code != exitUsage || stderr != tc.want {
			t.Errorf("pepsi-httpd %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// A database that is down when pepsi-httpd starts is not a reason to exit
// (under a supervisor that is a crash loop): it serves pepsi_database_up 0 and a
// 503 /healthz, says so in one log line, and works normally once the database
// answers.
func TestADatabaseDownAtStartIsServedAsDownUntilItComes(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.NewMigrated(t))
	if err != nil {
		t.Fatal(err)
	}
	// The proxy stands before the server PEPSI_TEST_DATABASE_URL names,
	// whatever its host and port.
	server := u.Host
	if u.Port() == "" {
		server = net.JoinHostPort(u.Hostname(), "5432")
	}
	proxy, err := netfault.Start(server)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	proxy.Refuse() // the database is down

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan int, 1)
	var stderr lockedbuf.Buffer
	go func() {
		done <- run(ctx, []string{"-database", u.String(), "-listen", "127.0.0.1:0", "-cache", "10ms"}, io.Discard, &stderr, nil, func(a string) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case code := <-done:
		t.Fatalf("pepsi-httpd exited %d with the database down; want it to serve. stderr:\n%s", code, stderr.String())
	}
	if code, body := httpGet(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "pepsi_database_up 0") {
		t.Errorf("GET /metrics with the database down: %d, want 200 with pepsi_database_up 0:\n%s", code, body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /healthz with the database down: %d, want 503", code)
	}
	if log := stderr.String(); strings.Count(log, "cannot read the database at start") != 1 {
		t.Errorf("want one log line saying the database cannot be read at start; stderr:\n%s", log)
	}

	proxy.Heal() // the database comes
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := httpGet(t, base+"/metrics")
		hcode, _ := httpGet(t, base+"/healthz")
		if code == http.StatusOK && strings.Contains(body, "pepsi_database_up 1") && hcode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the database came: /metrics %d, /healthz %d; want pepsi_database_up 1 and 200", code, hcode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d after the signal, want 0", code)
	}
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestADatabaseWithoutSchemaVersion2IsOneLineAndExit1(t *testing.T) {
	t.Parallel()
	code, stderr := runFor(t, "-database", pgtest.NewDatabase(t))
	want := "no PEPSI schema of version 13 or later (index pepsi.queue_failed or table pepsi.stage_health is missing): run pepsi-queue migrate\n"
	if code != exitFailure || !strings.HasSuffix(stderr, want) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("exit %d, stderr %q; want exit 1 and one line ending %q", code, stderr, want)
	}
}

func TestServesFromTheEnvironmentAndStopsCleanlyOnSignal(t *testing.T) {
	url := pgtest.NewMigrated(t)
	t.Setenv("PEPSI_DATABASE", url)
	t.Setenv("PEPSI_LISTEN", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan int, 1)
	go func() { done <- run(ctx, nil, io.Discard, io.Discard, nil, func(a string) { addr <- a }) }()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case code := <-done:
		t.Fatalf("pepsi-httpd exited %d before serving", code)
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Errorf("serving on %s, want 127.0.0.1", base)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/metrics": "pepsi_database_up 1"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, want 200 with %q", path, resp.StatusCode, want)
		}
	}
	cancel() // as SIGTERM does
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after the signal, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pepsi-httpd did not stop within 10 s of the signal")
	}
}

func TestABadValueFromTheEnvironmentNamesTheVariable(t *testing.T) {
	hint := "\nRun 'pepsi-httpd -h' for help.\n"
	t.Setenv("PEPSI_LISTEN", "localhost")
	code, stderr := runFor(t)
	if want := `pepsi-httpd: PEPSI_LISTEN "localhost": address localhost: missing port in address` + hint; code != exitUsage || stderr != want {
		t.Errorf("PEPSI_LISTEN=localhost: exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
	t.Setenv("PEPSI_LISTEN", "")
	t.Setenv("PEPSI_LOG_FORMAT", "xml")
	code, stderr = runFor(t)
	if want := `pepsi-httpd: PEPSI_LOG_FORMAT "xml": want text or json` + hint; code != exitUsage || stderr != want {
		t.Errorf("PEPSI_LOG_FORMAT=xml: exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
	code, stderr = runFor(t, "-log-format", "yaml")
	if want := `pepsi-httpd: -log-format "yaml": want text or json` + hint; code != exitUsage || stderr != want {
		t.Errorf("-log-format yaml over PEPSI_LOG_FORMAT: exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
}

// -h and -version, asked for, print to standard output and exit 0, so that
// `pepsi-httpd -h | less` and `pepsi-httpd -version > file` work.
func TestHelpAndVersionGoToStandardOutput(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{"-h": "-statement-timeout", "-version": "pepsi-httpd "} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{args}, &stdout, &stderr, nil, func(string) { t.Errorf("%s started serving", args) })
		if code != exitOK || !strings.Contains(stdout.String(), want) || stderr.Len() != 0 {
			t.Errorf("pepsi-httpd %s: exit %d, stdout %q, stderr %q; want 0 and %q on stdout only", args, code, stdout.String(), stderr.String(), want)
		}
	}
}

// With ACTIONS = on and a tokens file in [pepsi-httpd] of the -c file, the
// page offers its actions (and says so at start); without, it does not.
func TestActionsAreOnlyWhatTheConfigurationTurnsOn(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "operators")
	if err := os.WriteFile(tokens, []byte("operator-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		section, want string
	}{
		{"", `{"actions":false,"signed_in":false}`},
		{"[pepsi-httpd]\nACTIONS = off\nTOKENS_FILE = " + tokens + "\n", `{"actions":false,"signed_in":false}`},
		{"[pepsi-httpd]\nACTIONS = on\nTOKENS_FILE = " + tokens + "\n", `{"actions":true,"signed_in":false}`},
	} {
		file := filepath.Join(t.TempDir(), "pepsi.conf")
		if err := os.WriteFile(file, []byte("[pepsi]\nDATABASE = "+url+"\n"+tc.section), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		addr, done := make(chan string, 1), make(chan int, 1)
		var stderr lockedbuf.Buffer
		go func() {
			done <- run(ctx, []string{"-c", file, "-listen", "127.0.0.1:0"}, io.Discard, &stderr, nil, func(a string) { addr <- a })
		}()
		select {
		case a := <-addr:
			if code, body := httpGet(t, "http://"+a+"/api/session"); code != http.StatusOK || strings.TrimSpace(body) != tc.want {
				t.Errorf("%q: GET /api/session: %d %s, want %s", tc.section, code, body, tc.want)
			}
		case code := <-done:
			t.Fatalf("%q: pepsi-httpd exited %d before serving: %s", tc.section, code, stderr.String())
		}
		cancel()
		<-done
		if on := strings.Contains(tc.want, `"actions":true`); strings.Contains(stderr.String(), "actions=true") != on {
			t.Errorf("%q: the start-up line %q does not say actions=%v", tc.section, stderr.String(), on)
		}
	}
}

// Proves: SIGHUP re-reads TOKENS_FILE, as pepsi-ingress re-reads its tokens:
// a token added works and one taken out is refused, a file that fails to
// load leaves the tokens in use as they were, and the server serves on
// (without a handler SIGHUP ended pepsi-httpd, found from outside).
func TestSIGHUPReloadsTheTokensFile(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "operators")
	const first, second = "operator-token-0123456789", "operator-token-9876543210"
	if err := os.WriteFile(tokens, []byte(first+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "pepsi.conf")
	if err := os.WriteFile(file, []byte("[pepsi]\nDATABASE = "+url+"\n[pepsi-httpd]\nACTIONS = on\nTOKENS_FILE = "+tokens+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	base, stderr := serveFor(t, hup, "-c", file, "-listen", "127.0.0.1:0")
	refused := func(token string) bool {
		req, err := http.NewRequest("POST", "http://"+base+"/api/messages/1/retry", strings.NewReader(`{"dry_run": true}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	}
	// hangUp sends SIGHUP and waits for the n-th line that says what it did.
	hangUp := func(says string, n int) {
		hup <- syscall.SIGHUP
		for deadline := time.Now().Add(10 * time.Second); strings.Count(stderr.String(), says) < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q after SIGHUP: %s", says, stderr.String())
			}
		}
	}
	if refused(first) || !refused(second) {
		t.Fatalf("at start: the first token refused %v, the second %v; want the first only taken", refused(first), refused(second))
	}
	if err := os.WriteFile(tokens, []byte(second+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hangUp("SIGHUP: tokens reloaded", 1)
	if !refused(first) || refused(second) {
		t.Errorf("after SIGHUP: the first token refused %v, the second %v; want the second only taken", refused(first), refused(second))
	}
	if err := os.WriteFile(tokens, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hangUp("SIGHUP: tokens not reloaded", 1)
	if refused(second) {
		t.Errorf("after a SIGHUP whose file failed to load: the second token refused; want the tokens in use kept")
	}
	if code, _ := httpGet(t, "http://"+base+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz after the SIGHUPs: %d, want 200", code)
	}
}

// Proves: -hosts names the hosts the page answers to, beside this machine's
// own name: a request for one of them is served, one for another name is
// answered 421 (httpd's TestThePageAnswersOnlyToItsOwnHosts has the rule),
// and the first refusal is logged with its host.
func TestHostsNamesThePagesHosts(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	base, stderr := serveFor(t, nil, "-database", url, "-listen", "127.0.0.1:0", "-hosts", "pepsi.example.org, ops.example.org")
	self, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{"pepsi.example.org": 200, "ops.example.org:9650": 200, self: 200, "attacker.example": 421, "other.example": 421} {
		req, err := http.NewRequest("GET", "http://"+base+"/api/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	if n := strings.Count(stderr.String(), "refused (421)"); n != 1 {
		t.Errorf("%d log lines of a refused host, want the first one only: %s", n, stderr.String())
	}
}
