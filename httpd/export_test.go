package httpd

import "github.com/jackc/pgx/v5/pgxpool"

// Pool exposes the Source's connections to the tests, to check their settings.
func (s *Source) Pool() *pgxpool.Pool { return s.pool }
