package traceparent

import (
	"testing"
	"time"
)

// TestHashInt8ExtendedIsPostgreSQLs holds the port to values PostgreSQL 15
// returned for SELECT hashint8extended(val, seed) (the store's
// TestPassSpanIsTheDatabasesHash compares many more against the server).
func TestHashInt8ExtendedIsPostgreSQLs(t *testing.T) {
	for _, c := range []struct {
		val  int64
		seed int64
		want int64
	}{
		{0, 0, 4154612158245552303},
		{1, 0, -3670598878359251130},
		{-5, 42, -8747513389509221398},
		{1234567890123, -7, -1272067510654033642},
		{99, 0, -4328632632441626078},
	} {
		if got := int64(hashInt8Extended(c.val, uint64(c.seed))); got != c.want {
			t.Errorf("hashint8extended(%d, %d) = %d, PostgreSQL says %d", c.val, c.seed, got, c.want)
		}
	}
}

// TestPassSpanIDIsPostgreSQLs holds PassSpanID to what schema 22's
// pepsi.pass_span returned on PostgreSQL 15.
func TestPassSpanIDIsPostgreSQLs(t *testing.T) {
	for _, c := range []struct {
		id   int64
		at   string
		want string
	}{
		{42, "2026-12-02T19:00:00.123456Z", "4cab7ba4e1e74646"},
		{5000000000, "1969-12-31T23:59:59.5Z", "a3a765a441361e21"},
	} {
		at, err := time.Parse(time.RFC3339Nano, c.at)
		if err != nil {
			t.Fatal(err)
		}
		if got := PassSpanID(c.id, at); got != c.want {
			t.Errorf("PassSpanID(%d, %s) = %s, pepsi.pass_span says %s", c.id, c.at, got, c.want)
		}
	}
}

func TestAPassTraceparentKeepsTheTraceAndFlagsAndNamesThePass(t *testing.T) {
	at := time.Date(2026, 12, 2, 19, 0, 0, 123456000, time.UTC)
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	got := Pass(tp, 42, at)
	if got[:36] != tp[:36] || got[52:] != tp[52:] || got[36:52] != PassSpanID(42, at) {
		t.Fatalf("Pass(%s) = %s: want the trace id and flags kept and span %s", tp, got, PassSpanID(42, at))
	}
	if _, ok := SpanContext(got); !ok {
		t.Fatalf("Pass gave %q, not a valid traceparent", got)
	}
	if PassSpanID(42, at) == PassSpanID(42, at.Add(time.Microsecond)) || PassSpanID(42, at) == PassSpanID(43, at) {
		t.Fatal("two passes (another claim instant, another message) got one span id")
	}
	if Pass("", 42, at) != "" {
		t.Fatal("a message without a traceparent has no pass traceparent")
	}
}
