package msgjson_test

import (
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/msgjson"
)

func TestFieldsSayWhichOptionalFieldsAreTaken(t *testing.T) {
	line := []byte(`{"stage": "parse", "key": "order-1", "payload": "x"}`)
	if _, err := msgjson.Parse(line, msgjson.Fields{}); err == nil || !strings.Contains(err.Error(), `unknown field "stage" (want payload or payload_base64, and optionally state)`) {
		t.Errorf("without Stage and Key: %v; want stage refused as an unknown field", err)
	}
	if _, err := msgjson.Parse(line, msgjson.Fields{Stage: true}); err == nil || !strings.Contains(err.Error(), `unknown field "key"`) {
		t.Errorf("without Key: %v; want key refused", err)
	}
	m, err := msgjson.Parse(line, msgjson.Fields{Stage: true, Key: true})
	if err != nil || m.Stage != "parse" || m.Key != "order-1" || string(m.Payload) != "x" {
		t.Errorf("with both: %+v, %v", m, err)
	}
}

func TestLimitRefusesDeepNestingOnly(t *testing.T) {
	nest := func(n int) []byte {
		return []byte(`{"payload": ` + strings.Repeat("[", n) + strings.Repeat("]", n) + `, "state": {"s": "[[[[{{{{"}}`)
	}
	// The object itself is one level: 63 arrays inside make 64.
	if _, err := msgjson.Parse(nest(63), msgjson.Fields{Limit: true}); err != nil {
		t.Errorf("64 deep: %v; want it accepted (brackets inside strings do not count)", err)
	}
	if _, err := msgjson.Parse(nest(64), msgjson.Fields{Limit: true}); err == nil || !strings.Contains(err.Error(), "nested more than 64 deep") {
		t.Errorf("65 deep: %v; want it refused", err)
	}
	if _, err := msgjson.Parse(nest(200), msgjson.Fields{}); err != nil {
		t.Errorf("without Limit: %v; want any depth the decoder takes", err)
	}
}
