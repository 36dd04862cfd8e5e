package otlpreceiver_test

// Its init clears the PG*, PEPSI_* and OTEL_* variables the caller exported.
import _ "github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"
