package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// pepsi is the binary under test, built once per test run.
var pepsi = gobuild.Once("cmd/pepsi-ingress")

// TestMain removes the built binary after the tests.
func TestMain(m *testing.M) { pepsi.Main(m) }

// writeConf writes a pepsi.conf for db with stage "a" and the given
// [pepsi-ingress] lines.
func writeConf(t *testing.T, db string, ingressLines ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pepsi.conf")
	text := fmt.Sprintf("[pepsi]\nDATABASE = %s\n[stage-a]\nPROGRAM = cat\n[pepsi-ingress]\n%s\n", db, strings.Join(ingressLines, "\n"))
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// process is a running pepsi-ingress.
type process struct {
	cmd  *exec.Cmd
	addr string
	log  *lockedbuf.Buffer
	done chan int
}

// launch starts the binary and waits until it serves.
func launch(t *testing.T, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(pepsi.Path(t), args...), log: &lockedbuf.Buffer{}, done: make(chan int, 1)}
	pr, pw := io.Pipe()
	p.cmd.Stderr = io.MultiWriter(pw, p.log)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	go func() {
		p.cmd.Wait()
		pw.Close()
		p.done <- p.cmd.ProcessState.ExitCode()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), "addr="); ok && strings.Contains(sc.Text(), "serving") {
				a := strings.Fields(rest)[0]
				a = strings.TrimPrefix(strings.TrimPrefix(a, "http://"), "https://")
				addr <- strings.TrimSuffix(a, "/v1/messages")
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case p.addr = <-addr:
	case code := <-p.done:
		p.done <- code
		t.Fatalf("pepsi-ingress exited %d before serving: %s", code, p.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("pepsi-ingress did not serve within 30 s: %s", p.log)
	}
	return p
}

func (p *process) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-p.done:
		p.done <- code
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("pepsi-ingress did not exit: %s", p.log)
		return -1
	}
}

func post(client *http.Client, url, token, body string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages?stage=a", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-ndjson")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

func count(t *testing.T, db string) int {
	t.Helper()
	var n int
	if err := pgtest.Connect(t, db).QueryRow(context.Background(), "SELECT count(*) FROM pepsi.queue").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartRefusesAnOpenListenerWithoutTokensAndBadSettings(t *testing.T) {
	t.Parallel()
	db := "postgres://nobody@127.0.0.1:1/none"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"open -listen", []string{"-c", writeConf(t, db), "-listen", "0.0.0.0:0"}, exitUsage,
			`pepsi-ingress: -listen (LISTEN): '0.0.0.0:0' is not a loopback address, and there is no TOKENS_FILE`},
		{"open LISTEN", []string{"-c", writeConf(t, db, "LISTEN = :8180")}, exitUsage, `pepsi-ingress: configuration: `},
		{"missing tokens file", []string{"-c", writeConf(t, db, "TOKENS_FILE = /nonexistent/tokens")}, exitFailure, "pepsi-ingress: tokens: open /nonexistent/tokens"},
		{"missing certificate", []string{"-c", writeConf(t, db, "TLS_CERT = /nonexistent/c.pem", "TLS_KEY = /nonexistent/k.pem")}, exitFailure, "pepsi-ingress: TLS_CERT /nonexistent/c.pem"},
		{"no database", []string{"-c", writeConf(t, db+"?connect_timeout=2")}, exitFailure, `pepsi-ingress: PostgreSQL at 127.0.0.1:1`},
		{"bad flag", []string{"-batch-max", "0"}, exitUsage, "pepsi-ingress: -batch-max 0: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := run(ctx, tc.args, io.Discard, &stderr, nil, func(string) { t.Errorf("it started serving") })
			if code != tc.code || !strings.HasPrefix(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d starting %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// An OTEL_EXPORTER_OTLP_PROTOCOL pepsi-ingress cannot speak is a mistake in
// its configuration, refused at start with exit status 2 (docs/operations.md,
// "Traces"), as pepsi-dispatch refuses it. Not parallel: it sets the
// environment the exporter reads.
func TestAnUnsupportedTraceProtocolIsRefusedWithExit2(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, []string{"-c", writeConf(t, pgtest.NewMigrated(t))}, io.Discard, &stderr, nil, func(string) { t.Errorf("it started serving") })
	if code != exitUsage || !strings.Contains(stderr.String(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("exit %d, stderr %q; want %d naming OTEL_EXPORTER_OTLP_PROTOCOL", code, stderr.String(), exitUsage)
	}
}

// A mistake on the command line is one line and a pointer to -h, as in every
// PEPSI program (cliflags.Fail); a mistake in the configuration file is one
// line, without the pointer, since -h cannot help with it.
func TestFlagMistakesPointToTheHelp(t *testing.T) {
	t.Parallel()
	db := "postgres://nobody@127.0.0.1:1/none"
	hint := "\nRun 'pepsi-ingress -h' for help.\n"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bogus"}, "pepsi-ingress: flag provided but not defined: -bogus" + hint},
		{[]string{"extra"}, `pepsi-ingress: unexpected arguments ["extra"]` + hint},
		{[]string{"-committers", "0"}, "pepsi-ingress: -committers 0: must be positive" + hint},
		{[]string{"-idle-timeout", "0s"}, "pepsi-ingress: -idle-timeout 0s: must be positive" + hint},
		{[]string{"-batch-idle", "-1s"}, "pepsi-ingress: -batch-idle -1s: must not be negative" + hint},
		{[]string{"-log-level", "loud"}, `pepsi-ingress: -log-level "loud": want debug, info, warn or error` + hint},
		{[]string{"-c", writeConf(t, db), "-listen", "localhost"}, `pepsi-ingress: -listen "localhost": address localhost: missing port in address` + hint},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), tc.args, io.Discard, &stderr, nil, func(string) { t.Errorf("pepsi-ingress %q started serving", tc.args) })
		got := stderr.String()
		if code != exitUsage || got != tc.want {
			t.Errorf("pepsi-ingress %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, got, tc.want)
		}
	}
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"-c", filepath.Join(t.TempDir(), "none.conf")}, io.Discard, &stderr, nil, nil)
	if got := stderr.String(); code != exitUsage || !strings.HasPrefix(got, "pepsi-ingress: configuration: open ") || strings.Count(got, "\n") != 1 {
		t.Errorf("a configuration file that cannot be read: exit %d, stderr %q; want exit 2 and one line", code, stderr.String())
	}
}

// Proves: pepsi-ingress refuses a configuration whose PROGRAM is a relative
// path with the line pepsi-dispatch gives for it (core/conf), in one line and
// exit 2, so both programs agree on what a valid file is.
func TestARelativeProgramPathIsRefusedAsByTheDispatcher(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(file, []byte("[pepsi]\nDATABASE = postgres://nobody@127.0.0.1:1/none\n[stage-a]\nPROGRAM = sub/prog\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"-c", file}, io.Discard, &stderr, nil, func(string) { t.Error("pepsi-ingress started serving") })
	want := "pepsi-ingress: configuration: " + file + ":4: PROGRAM: 'sub/prog' is a relative path: a path must be absolute (a bare name is looked up on PATH)\n"
	if got := stderr.String(); code != exitUsage || got != want {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, got, want)
	}
}

// TestSIGTERMFinishesTheRequestsInFlightAndExits0 holds a request in its
// batch wait when SIGTERM arrives: it is committed and answered 202, new
// connections are refused, and the program exits 0.
func TestSIGTERMFinishesTheRequestsInFlightAndExits0(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	p := launch(t, "-c", writeConf(t, db, "LISTEN = 127.0.0.1:0"), "-batch-wait", "1s", "-batch-idle", "1s")
	// The request is written whole on a connection of its own before the
	// signal: the server has the connection, so shutdown must wait for it.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"payload": "in flight"}`
	fmt.Fprintf(c, "POST /v1/messages?stage=a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	time.Sleep(100 * time.Millisecond) // the request now waits for its batch
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != 202 {
		t.Fatalf("the request in flight at SIGTERM: %v %v; want 202", res, err)
	}
	answer, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(answer), `"ids":[1]`) {
		t.Errorf("answer %q; want the id of the one row", answer)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit %d; want 0\n%s", code, p.log)
	}
	if n := count(t, db); n != 1 {
		t.Errorf("%d rows; want the one answered 202", n)
	}
	if _, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		t.Errorf("a connection after shutdown was accepted")
	}
}

// TestSIGHUPReloadsTheTokensAndTLSWorks serves over TLS with a tokens file,
// then replaces the token and sends SIGHUP.
func TestSIGHUPReloadsTheTokensAndTLSWorks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("first-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, pool := selfSigned(t, dir)
	p := launch(t, "-c", writeConf(t, db, "LISTEN = 127.0.0.1:0", "TOKENS_FILE = "+tokens, "TLS_CERT = "+certFile, "TLS_KEY = "+keyFile))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + p.addr
	check := func(token string, want int) {
		t.Helper()
		code, body, err := post(client, url, token, `{"payload": "x"}`)
		if err != nil || code != want {
			t.Errorf("token %q: %d %q %v; want %d", token, code, body, err, want)
		}
	}
	check("first-token-0123456789", 202)
	check("", 401)
	check("second-token-0123456789", 401)
	if err := os.WriteFile(tokens, []byte("second-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.log.String(), "tokens reloaded"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged: %s", p.log)
		}
	}
	check("first-token-0123456789", 401)
	check("second-token-0123456789", 202)
	if n := count(t, db); n != 2 {
		t.Errorf("%d rows; want 2", n)
	}
	if code, _, err := post(http.DefaultClient, "http://"+p.addr, "second-token-0123456789", `{"payload": "x"}`); err == nil && code != 400 {
		t.Errorf("plain HTTP to the TLS listener: %d; want 400 or no answer", code)
	}
	if strings.Contains(p.log.String(), "second-token") || strings.Contains(p.log.String(), `"x"`) {
		t.Errorf("the log shows a token or a payload: %s", p.log)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pepsi-ingress test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// -h and -version, asked for, print to standard output and exit 0, so that
// `pepsi-ingress -h | less` and `pepsi-ingress -version > file` work.
func TestHelpAndVersionGoToStandardOutput(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{"-h": "-max-in-flight", "-version": "pepsi-ingress "} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{args}, &stdout, &stderr, nil, func(string) { t.Errorf("%s started serving", args) })
		if code != exitOK || !strings.Contains(stdout.String(), want) || stderr.Len() != 0 {
			t.Errorf("pepsi-ingress %s: exit %d, stdout %q, stderr %q; want 0 and %q on stdout only", args, code, stdout.String(), stderr.String(), want)
		}
	}
}

// TestKeyedMessagesAreTakenOnARepeatableReadDefault: on a database whose
// sessions start at REPEATABLE READ, pepsi-ingress inserts keyed messages
// (with an idempotency key, in its own transaction, and without, in one
// statement) at READ COMMITTED all the same, which the order-key trigger
// needs (schema 36, which refuses such inserts at REPEATABLE READ: there a
// head finished since could look unfinished, and leave its key stuck).
func TestKeyedMessagesAreTakenOnARepeatableReadDefault(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, db).Exec(context.Background(), `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	p := launch(t, "-c", writeConf(t, db, "LISTEN = 127.0.0.1:0"))
	for _, body := range []string{
		`{"payload": "a", "order_key": "acct-9"}` + "\n" + `{"payload": "b", "order_key": "acct-9", "key": "b"}`,
		`{"payload": "c", "order_key": "acct-9"}`,
	} {
		code, answer, err := post(http.DefaultClient, "http://"+p.addr, "", body)
		if err != nil || code != 202 {
			t.Fatalf("keyed request: %d %s %v; want 202\n%s", code, answer, err, p.log)
		}
	}
	var got string
	if err := pgtest.Connect(t, db).QueryRow(context.Background(),
		`SELECT string_agg(status, ' ' ORDER BY ingress_id) FROM pepsi.queue`).Scan(&got); err != nil || got != "pending blocked blocked" {
		t.Errorf("statuses %q, %v; want pending blocked blocked", got, err)
	}
}

// TestOnlyAMissingSchemaIsSentToMigrate: a database that does not answer at
// start is said to be unreachable, and nothing more; before, every failure
// to read the schema version ended "(run pepsi-queue migrate)", which sent an
// operator whose database was down to migrate it. A database without the
// PEPSI schema is still sent there.
func TestOnlyAMissingSchemaIsSentToMigrate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, db, want, not string
	}{
		{"unreachable", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2", "connect: connection refused", "migrate"},
		{"no schema", pgtest.NewDatabase(t), "the database has no PEPSI schema: run pepsi-queue migrate", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := run(ctx, []string{"-c", writeConf(t, tc.db, "LISTEN = 127.0.0.1:0")}, io.Discard, &stderr, nil, func(string) { t.Errorf("it started serving") })
			if code != exitFailure || !strings.Contains(stderr.String(), tc.want) || tc.not != "" && strings.Contains(stderr.String(), tc.not) {
				t.Errorf("exit %d, stderr %q; want %d with %q and without %q", code, stderr.String(), exitFailure, tc.want, tc.not)
			}
		})
	}
}

// TestItsSessionsWaitForALockAtMostLockWait: the pool's sessions wait for a
// lock at most ingress.LockWait (lock_timeout), under the commit's timeout,
// so that a request behind another producer's open transaction is told that
// nothing of it was committed (ingress, TestALockWaitThatRunsOutIsA503ThatCommittedNothing).
func TestItsSessionsWaitForALockAtMostLockWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := connect(ctx, pgtest.NewMigrated(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var got string
	if err := pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if d, err := time.ParseDuration(got); err != nil || d != ingress.LockWait {
		t.Errorf("lock_timeout %q; want %v", got, ingress.LockWait)
	}
}

// TestA202AnswersADurableCommitWhateverTheDatabasesDefault: on a database
// whose sessions commit with synchronous_commit off, pepsi-ingress's sessions
// commit with it on, so that a 202 is never lost: with it off, a COMMIT
// returns before its WAL is flushed, and a crash of the server (pg_ctl stop
// -m immediate) lost two of three messages just answered 202.
func TestA202AnswersADurableCommitWhateverTheDatabasesDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, db).Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	pool, err := connect(ctx, db, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var got string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil || got != "on" {
		t.Errorf("synchronous_commit %q, %v; want on", got, err)
	}
}
