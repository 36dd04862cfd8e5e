package httpd

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool exposes the Source's connections to the tests, to check their settings.
func (s *Source) Pool() *pgxpool.Pool { return s.pool }

// SetTimeout sets how long an action's database work may take (actionTimeout).
func (a *Actions) SetTimeout(d time.Duration) { a.timeout = d }
