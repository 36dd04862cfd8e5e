package relay_test

// Its init clears the PG* and PEPSI_* variables the caller exported, so that
// no test here, nor any program it starts, takes them over its own settings.
import _ "github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"
