//go:build tools

package tools

import (
	_ "github.com/jackc/pgx/v5"
	_ "github.com/ory/dockertest/v3"
	_ "github.com/peterbourgon/ff/v3"
	_ "github.com/schollz/progressbar/v3"
	_ "pgregory.net/rapid"
)
