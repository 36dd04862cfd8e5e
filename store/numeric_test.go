package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestTheCoreRefusesTheNumbersJSONBRefuses holds core.NumericRefuses, which
// the dispatcher's patch and emit checks and pepsi-ingress's state check
// use, to the server: a number it lets through that jsonb refuses would fail
// the dispatcher's whole transaction, again and again (a stage answering
// {"a":1e-20000} once stopped every message), and one it refuses that jsonb
// takes would fail a message for nothing. The numbers are the edges of
// numeric's range and random ones around them.
func TestTheCoreRefusesTheNumbersJSONBRefuses(t *testing.T) {
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	r := rand.New(rand.NewPCG(pgtest.Seed(t, "./store/"), 1))
	numbers := []string{"0", "-0.0", "1e131071", "1e131072", "9.9e131071", "10e131070", "10e131071",
		"0.0001e131075", "0.0001e131076", "1e-16383", "1e-16384", "0e-16383", "0e-16384", "0e131072",
		"0e999999", "0e1073741822", "0e1073741823", "1.5e-16382", "1.55e-16382", "0.1e-16383",
		"0.00000e-16379", "123e-16383", "-1e131071", "1e-32767", "1e2147483646", "1e99999999999999999999"}
	for range 300 {
		numbers = append(numbers, nearEdge(r))
	}
	ctx := context.Background()
	for _, n := range numbers {
		_, err := conn.Exec(ctx, "SELECT $1::text::jsonb", `{"a":`+n+`}`)
		var pgErr *pgconn.PgError
		switch refused := core.NumericRefuses(n); {
		case err == nil && refused:
			t.Errorf("core.NumericRefuses(%s) = true; jsonb takes it", n)
		case err != nil && !errors.As(err, &pgErr):
			t.Fatalf("jsonb of %s: %v", n, err)
		case err != nil && pgErr.Code != "22003":
			t.Errorf("jsonb of %s: %v; want 22003 (value overflows numeric format) or nothing", n, err)
		case err != nil && !refused:
			t.Errorf("core.NumericRefuses(%s) = false; jsonb refuses it: %v", n, err)
		}
	}
}

// nearEdge draws a JSON number whose scale or weight lies within a few
// digits of numeric's limits: a sign, a whole part with leading zeros or
// none, a fraction with trailing zeros or none, an exponent near ±16383 or
// +131071 less the digits written.
func nearEdge(r *rand.Rand) string {
	var b strings.Builder
	if r.IntN(2) == 0 {
		b.WriteByte('-')
	}
	whole := "0"
	if r.IntN(3) > 0 {
		whole = fmt.Sprint(1 + r.IntN(999))
	}
	b.WriteString(whole)
	frac := ""
	if r.IntN(2) == 0 {
		frac = strings.Repeat("0", r.IntN(3)) + fmt.Sprint(r.IntN(100))
		b.WriteString("." + frac)
	}
	exp := []int{-16383, 131071}[r.IntN(2)] + r.IntN(9) - 4
	if exp < 0 {
		exp += len(frac) - 4 + r.IntN(9)
	} else {
		exp -= len(whole) - 1
	}
	fmt.Fprintf(&b, "e%d", exp)
	return b.String()
}
