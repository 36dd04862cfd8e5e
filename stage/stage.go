// Package stage turns a map of handlers into a PEPSI stage program: a process
// that pepsi-dispatch starts as "PROGRAM worker [-c FILE]", that reads message ids
// on standard input and answers one status line per id (the worker protocol:
// docs/stages.md, "In any other language"). A stage in Go is a main of a few lines:
//
//	func main() {
//		stage.Main(map[string]stage.Handler{
//			"parse": func(ctx context.Context, m *stage.Message) stage.Result {
//				m.State["parsed"] = true
//				return stage.Advance("enrich")
//			},
//		})
//	}
//
// # Answers that carry the transition
//
// The library reads the rows of all the ids it holds (every id already on
// standard input) in one statement, without a lock, then runs the handlers one
// by one. A row that is not running at this stage (moved meanwhile, or missing)
// is answered "0" without calling the handler. For the others the transition the
// handler chose goes on the status line and the stage writes nothing: the
// dispatcher writes it, guarded, in its own batched transaction:
//
//	stage.Advance("deliver")  0 >deliver
//	stage.Done()              0 >done
//	stage.Pause(t)            0 >paused:SECONDS   (seconds from now until t, 0 if t is past)
//
// followed by the fused stages' times ("0 >deliver tag:153", see Fuse) and, if
// the handler changed m.State, one compact JSON object with the top-level keys
// it added or changed, which the dispatcher merges into the row's state
// (state || patch): "0 >deliver tag:153 {"region":"eu"}". Such a pass costs no
// round trip of its own; a batch of ids costs one.
//
// # Emitting messages
//
// A handler may emit new messages, for example one per row of an uploaded
// file, with Message.Emit:
//
//	for _, row := range rows {
//		if err := m.Emit(stage.Emit{Stage: "row", Payload: row}); err != nil {
//			return stage.Error(err.Error())
//		}
//	}
//	return stage.Done()
//
// The library writes them as emit lines ("+{"stage":"row","payload":…}")
// before the status line, and the dispatcher inserts them, with parent_id,
// in the transaction that writes the answered transition: they exist exactly
// when the pass committed (docs/protocol.md, "Emitting messages"). They ride
// only Advance, Done and Pause; with Failed, Error or Retry nothing is
// emitted, and a transition the library must write itself (below) fails the
// message rather than lose or orphan its children. Both input modes emit.
//
// # Transitions the library writes itself
//
// Some transitions cannot go on the line, and the library writes them itself, in
// one statement guarded by status = 'running' AND stage = this stage, and
// answers a bare "0" (with the fused stages' times):
//
//   - Failed: there is no answer target for it; the row becomes failed with
//     state.error.
//   - A handler that used Message.Tx: its statements must commit atomically with
//     the transition, so the library writes the transition in that transaction
//     and commits it. Its first statement on Message.Tx locks the row.
//   - A handler that deleted a key of m.State: state || patch cannot delete a
//     key, so the library writes the whole state, as it does after Message.Tx.
//     A handler that sets the key to null instead keeps the fast path.
//   - A patch that would make the line longer than 32 KiB. (In message mode,
//     with no database, the line carries up to the 64 KiB the dispatcher
//     reads; a longer one fails the message.)
//   - Every transition, with Options.WriteTransitions (WriteTransitions), for
//     a dispatcher that predates answers with a target.
//
// Without Message.Tx such a write holds no lock: it goes only over the row
// version the handler was given (its xmin); if anything else changed the row
// meanwhile, it writes nothing and the pass runs again on the row as it is now,
// as it does when the first statement on Message.Tx finds the row changed.
//
// # Durability
//
// An answered transition is durable when the dispatcher's transaction that
// writes it commits; if the dispatcher dies first, the message runs this stage
// again. For the transitions it writes itself, the library sets
// synchronous_commit = off on its one connection, so a stage commit does not
// wait for the WAL flush. That is safe because the dispatcher's own synchronous
// commit, which always follows an answer (it requeues, resolves or fails the
// row), flushes the WAL up to and including the stage's commit. If PostgreSQL
// crashes in between, the stage's commit may be lost; the dispatcher detects
// that with its crash sentinel (docs/durability.md) and requeues the message
// instead of failing it, so the handler runs again. Handlers must therefore
// tolerate running more than once for the same message (at-least-once), which
// they must anyway: a connection lost during COMMIT leaves its outcome unknown,
// and the library then runs the id again (the guard makes that safe for the row;
// external side effects are the handler's business).
//
// This package must never write the statistics tables or state.dispatch_error
// (both belong to the dispatcher), never write a row that is not running at its
// own stage, and never answer an id before its transaction has ended.
package stage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/buildinfo"
	"github.com/pepsi-pipeline/pepsi/internal/logflags"
)

// Handler handles one message at one stage. It may modify m.State (its changes
// go with the transition) and run statements on m.Tx, the message's
// transaction, which begins and locks the row at the first of them. It must not
// commit or roll back m.Tx. It may run more than once for the same message (see
// the package comment). A panic is caught and answered as a failure of this
// message.
type Handler func(ctx context.Context, m *Message) Result

// Message is the claimed row a Handler works on.
type Message struct {
	// ID is the row's ingress_id.
	ID int64
	// Stage is the stage whose handler is running (a fused stage's own name while
	// its handler runs).
	Stage string
	// State is the row's state object, decoded with json.Decoder.UseNumber so that
	// numbers survive the round trip exactly (they arrive as json.Number). The
	// top-level keys the handler adds or changes go with the transition, as a
	// patch merged into the row's state; deleting a key makes the library write
	// the whole state itself (see the package comment).
	State map[string]any
	// Payload is the message content (nil when the column is NULL).
	Payload []byte
	// Attempts is the row's attempts column: how many times the message was
	// retried at this stage so far (answers Retry, "75"), in either input mode.
	Attempts int
	// OrderKey is the message's order key ("" for none), in either input
	// mode: the messages of one key reach their stages one at a time, oldest
	// first (docs/protocol.md, "Ordering per key"), so a handler may apply
	// them in order to the entity the key names.
	OrderKey string
	// TraceParent is the W3C traceparent of this pass ("" for none), in
	// either input mode: the message's trace id and the span id of this
	// pass, which pepsi-dispatch exports as the span "process <stage>"
	// (docs/protocol.md, "Traces"). The handler's context carries it too,
	// as OpenTelemetry's remote span context (trace.SpanContextFromContext),
	// so an application's own spans are children of the pass.
	TraceParent string
	// Tx is the message's transaction: its first statement begins it and locks
	// the row; statements run on it commit atomically with the transition, which
	// the library then writes itself. Its Commit and Rollback refuse (the library
	// ends it); Begin makes a savepoint.
	Tx pgx.Tx

	// emitted holds what Emit collected in this pass.
	emitted emitted
}

// Options configure Run. Main fills them from the command line, the environment
// and pepsi.conf; tests fill them directly.
type Options struct {
	// Stage is the stage this process serves (PEPSI_STAGE); it must have a handler.
	Stage string
	// Handlers maps stage names to their handlers.
	Handlers map[string]Handler
	// Fused names stages that run inline: when a handler advances a message to a
	// fused stage, that stage's handler runs at once, in the same pass, and its
	// time is reported on the status line ("0 >deliver tag:153"). Each must have
	// a handler. See Fuse.
	Fused []string
	// WriteTransitions makes the library write every transition itself and
	// answer a bare "0", as stage programs did before answers carried the
	// transition: for a dispatcher that does not read "0 >TARGET" yet, and to
	// measure one way against the other. See WriteTransitions.
	WriteTransitions bool
	// Input is what In carries: conf.InputID (the default, also for ""): one
	// decimal message id per line, whose rows the library reads; or
	// conf.InputMessage: one message per line as JSON (docs/protocol.md,
	// "Standard input"), for a stage configured INPUT = message. In message mode
	// the library never connects to a database: DB is ignored, handlers get the
	// message from the line, the transition is always answered, and what only a
	// database could do (Failed, which sets state.error; a deleted state key;
	// Message.Tx) fails that message with a reason saying so. Main sets it from
	// PEPSI_INPUT, which pepsi-dispatch sets to "message" for such a stage.
	Input conf.Input
	// In delivers the input, one line per message.
	In io.Reader
	// Out receives one status line per id.
	Out io.Writer
	// DB is a libpq URL or key=value string; empty means the PG* environment.
	DB string
	// Log receives one record per problem; nil means a text logger on stderr.
	Log *slog.Logger
}

// Option changes how Main runs.
type Option func(*Options)

// Fuse makes the named stages run inline in this program's passes (see
// Options.Fused): stage.Main(handlers, stage.Fuse("tag")).
func Fuse(stages ...string) Option {
	return func(o *Options) { o.Fused = append(o.Fused, stages...) }
}

// WriteTransitions makes Main's stages write their transitions themselves (see
// Options.WriteTransitions).
func WriteTransitions() Option {
	return func(o *Options) { o.WriteTransitions = true }
}

// configError marks an error in how the program was started or configured: Main
// exits 2 for it, since retrying cannot help.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func badConfig(format string, args ...any) error {
	return &configError{fmt.Errorf(format, args...)}
}

// idLineMax bounds one input line; an id is at most 20 digits, so anything near
// this is a broken dispatcher, not a message. It is also the size of the input
// buffer, which bounds a batch (the ids already read when the first of them is
// taken) to idLineMax/2 ids.
const idLineMax = 4096

// Run serves o.Stage until o.In ends, answering every id it read, and returns
// nil. It returns an error if the options are unusable, if it cannot connect to
// the database at start, if its output breaks, or when ctx ends.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	if log == nil {
		log = NewLogger(os.Stderr)
	}
	w, err := newWorker(o, log)
	if err != nil {
		return err
	}
	if o.Input == conf.InputMessage {
		out := newAnswerWriter(o.Out)
		defer out.stop()
		return w.runMessages(ctx, o.In, out)
	}
	// Connect before reading anything: a worker that cannot reach the database
	// should exit at once, which the dispatcher counts as a program that cannot
	// start (its ids are requeued and the stage cools down), instead of holding
	// ids it cannot handle.
	if err := w.connect(ctx); err != nil {
		return err
	}
	defer w.close()

	in := newLineReader(o.In)
	out := newAnswerWriter(o.Out)
	defer out.stop()
	for {
		// Every answer is out before waiting for more input: the dispatcher hands
		// over more ids as answers arrive.
		if err := out.flush(); err != nil {
			return fmt.Errorf("write answers: %w", err)
		}
		line, err := in.next()
		if err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("read message ids: %w", err)
		}
		// The dispatcher hands over several ids at once: take every one that is
		// already here, so their rows are read in one statement.
		batch := []string{line}
		for {
			more, ok := in.buffered()
			if !ok {
				break
			}
			batch = append(batch, more)
		}
		if err := w.serve(ctx, batch, out); err != nil {
			return err
		}
	}
}

// parseID reads a message id from an input line.
func parseID(line string) (int64, bool) {
	id, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	return id, err == nil && id > 0
}

// answerWriter buffers status lines until flush. Every answer is flushed
// before the next pass runs (serve) and before more input is read (Run,
// runMessages): a worker that dies in a pass (a panic on a goroutine of its
// own, an os.Exit) must not take the answers before it along, for the
// dispatcher then fails its head, which would be a message already answered
// (docs/protocol.md: write the answer and flush before the next message).
// Only lines written together (a pass's emit lines and its answer) share a
// write.
type answerWriter struct {
	w   *bufio.Writer
	err error // the first write error; every later call returns it
}

func newAnswerWriter(w io.Writer) *answerWriter {
	return &answerWriter{w: bufio.NewWriter(w)}
}

// write buffers one status line.
func (a *answerWriter) write(line string) error {
	if a.err == nil {
		_, a.err = a.w.WriteString(line + "\n")
	}
	return a.err
}

// flush writes out every buffered line.
func (a *answerWriter) flush() error {
	if a.err == nil {
		a.err = a.w.Flush()
	}
	return a.err
}

// stop writes out what is buffered (those answers are final).
func (a *answerWriter) stop() {
	_ = a.flush() // Run is returning: it already has an error to report, or none
}

// usage is printed for a command line Main does not understand.
const usage = `usage: %s worker [-c FILE]

A PEPSI stage program. pepsi-dispatch starts it with PEPSI_STAGE set to the
stage to serve; it reads message ids on standard input and answers one status
line per id. -c names the pepsi.conf whose [pepsi] DATABASE it connects to;
PEPSI_DATABASE overrides that; with neither, the libpq PG* environment is used.
Stages in this program: %s
`

// Main runs the stage program: it parses "worker [-c FILE]", loads the database
// URL from pepsi.conf and PEPSI_DATABASE, and calls Run for the stage named by
// PEPSI_STAGE with standard input and output. It exits 0 at the end of input, 2 for
// a bad command line or configuration (with a line on stderr saying why), and 1
// for any other failure. It never returns.
//
// Unless GOMAXPROCS is set in the environment, Main runs the program on one
// processor (runtime.GOMAXPROCS(1)): a stage program handles one message at a
// time, and runs beside PARALLELISM others per stage, so more processors only
// make the Go scheduler spin and hand the goroutine between threads at every
// round trip, which costs a trivial stage about a sixth of its throughput.
func Main(handlers map[string]Handler, opts ...Option) {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
	os.Exit(runMain(os.Args, os.Stdin, os.Stdout, os.Stderr, handlers, opts))
}

// runMain is Main without the process around it, so its decisions are testable.
func runMain(args []string, stdin io.Reader, stdout, stderr io.Writer, handlers map[string]Handler, opts []Option) int {
	prog := "stage"
	if len(args) > 0 {
		prog = args[0]
	}
	if len(args) == 2 && (args[1] == "-version" || args[1] == "--version") {
		fmt.Fprintln(stdout, buildinfo.Version(filepath.Base(prog)))
		return 0
	}
	log := NewLogger(stderr)
	file, ok := parseArgs(args)
	if !ok {
		fmt.Fprintf(stderr, usage, prog, strings.Join(sortedNames(handlers), ", "))
		return 2
	}
	o := Options{Stage: os.Getenv("PEPSI_STAGE"), Input: conf.Input(os.Getenv("PEPSI_INPUT")), Handlers: handlers, In: stdin, Out: stdout, Log: log}
	switch o.Input {
	case "", conf.InputID, conf.InputMessage:
	default:
		log.Error("PEPSI_INPUT must be id or message", "PEPSI_INPUT", o.Input)
		return 2
	}
	for _, opt := range opts {
		opt(&o)
	}
	// A filter (message mode) reads nothing of the configuration: it needs
	// no database, and the file pepsi-dispatch names is the dispatcher's,
	// which a wrapper running the stage on another host has not got.
	if file != "" && o.Input != conf.InputMessage {
		text, err := os.ReadFile(file)
		if err != nil {
			log.Error("cannot read configuration", "err", err)
			return 2
		}
		c, err := conf.Parse(file, string(text))
		if err != nil {
			log.Error("bad configuration", "err", err)
			return 2
		}
		o.DB = c.Database
	}
	if db, set := os.LookupEnv("PEPSI_DATABASE"); set {
		o.DB = db
	}
	err := Run(context.Background(), o)
	if err == nil {
		return 0
	}
	log.Error("stage program stops", "stage", o.Stage, "err", err)
	var ce *configError
	if errors.As(err, &ce) {
		return 2
	}
	return 1
}

// parseArgs accepts exactly "worker", "worker -c FILE" and "worker -c=FILE".
func parseArgs(args []string) (file string, ok bool) {
	if len(args) < 2 || args[1] != "worker" {
		return "", false
	}
	rest := args[2:]
	switch {
	case len(rest) == 0:
		return "", true
	case len(rest) == 2 && (rest[0] == "-c" || rest[0] == "--c") && rest[1] != "":
		return rest[1], true
	case len(rest) == 1 && strings.HasPrefix(rest[0], "-c=") && len(rest[0]) > 3:
		return rest[0][3:], true
	}
	return "", false
}

// NewLogger returns the logger Main uses: slog text, one line per record (an
// error that spans lines, as a connection error does, is folded into one), no
// timestamp (the dispatcher that reads our stderr stamps and tags each line).
func NewLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return logflags.OneLineAttr(groups, a)
		},
	}))
}

func sortedNames(handlers map[string]Handler) []string {
	names := make([]string, 0, len(handlers))
	for name := range handlers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// isConnectionLoss reports whether err means the connection is gone (so the id
// must be run again on a new one) rather than that a statement failed. It
// classifies by behaviour: server errors by SQLSTATE class, everything else by
// whether pgx closed the connection.
func isConnectionLoss(err error, conn *pgx.Conn) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection_exception
	}
	return conn == nil || conn.IsClosed() || pgconn.Timeout(err)
}

// isTransient reports a serialization failure or deadlock: safe to run again.
func isTransient(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
