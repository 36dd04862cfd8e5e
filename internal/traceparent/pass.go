package traceparent

import (
	"math/bits"
	"strconv"
	"time"
)

// PassSpanID is the span id of the pass of message id whose claim wrote
// updated_at = claimedAt: 16 lower-case hex digits. The database computes the
// same value as pepsi.pass_span (schema 22), so the dispatcher, which needs it
// for every line of an INPUT = message stage and every span it exports,
// computes it here from the row the claim returned instead of asking the
// claim's backend, whose time bounds hops/s; a stage that reads its row
// computes it there. Two passes of one message are two claims, at two instants
// (a message is claimed at most once per transaction), so the id and the
// claim's microsecond name the pass; the trace id is not needed for that.
func PassSpanID(id int64, claimedAt time.Time) string {
	return hex16(passSpan(id, claimedAt.UnixMicro()))
}

// Pass is the pass's traceparent: tp, the message's, with the pass's span id
// (PassSpanID) in place of its parent's; "" when tp is none (pepsi.pass_traceparent
// gives NULL) or not well-formed (Wellformed: only an UPDATE of the queue can
// have written it, which the database no longer checks): a malformed
// traceparent makes no pass part of a trace.
func Pass(tp string, id int64, claimedAt time.Time) string {
	if !Wellformed(tp) {
		return ""
	}
	return tp[:36] + PassSpanID(id, claimedAt) + tp[52:]
}

// passSpan chains PostgreSQL's hashint8extended over the two halves of id and
// of the claim's microsecond (since 1970), as pepsi.pass_span does: one call
// folds a bigint's halves into 32 bits, so each value is hashed once whole and
// once by its high half, and distinct inputs stay distinct.
func passSpan(id, micros int64) uint64 {
	h := hashInt8Extended(id, 0)
	h = hashInt8Extended(id>>32, h)
	h = hashInt8Extended(micros, h)
	return hashInt8Extended(micros>>32, h)
}

// hashInt8Extended is PostgreSQL's hashint8extended(val, seed)
// (src/backend/utils/adt/hashfunc.c): the bigint's halves folded into 32 bits,
// then hash_bytes_uint32_extended (src/common/hashfn.c, Bob Jenkins' lookup3
// on one word). It works on integer values, not on bytes, so it is the same
// on every server whatever its byte order. TestPassSpanIsTheDatabasesHash
// holds it to the server's.
func hashInt8Extended(val int64, seed uint64) uint64 {
	lo, hi := uint32(val), uint32(val>>32)
	if val >= 0 {
		lo ^= hi
	} else {
		lo ^= ^hi
	}
	a := uint32(0x9e3779b9 + 4 + 3923095)
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	a += lo
	a, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}

// hex16 is v as 16 lower-case hex digits, as lpad(to_hex(v), 16, '0') writes
// a bigint (to_hex writes a negative one in two's complement).
func hex16(v uint64) string {
	s := strconv.FormatUint(v, 16)
	const zeros = "0000000000000000"
	return zeros[:16-len(s)] + s
}
