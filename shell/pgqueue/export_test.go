package pgqueue

// The statements, for the tests that EXPLAIN them.
const (
	ClaimSQL        = claimSQL
	ResetOrphansSQL = resetOrphansSQL
	WakeSQL         = wakeSQL
)
