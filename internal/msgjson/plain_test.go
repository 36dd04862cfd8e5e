package msgjson

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decode is Parse without its plain path: the decoder alone.
func decode(t *testing.T, text []byte, f Fields) (Message, error) {
	t.Helper()
	var obj struct {
		Stage    *string `json:"stage"`
		Key      *string `json:"key"`
		OrderKey *string `json:"order_key"`
		Payload  *string `json:"payload"`
	}
	d := json.NewDecoder(bytes.NewReader(text))
	d.DisallowUnknownFields()
	if err := d.Decode(&obj); err != nil {
		return Message{}, err
	}
	var m Message
	if obj.Stage != nil {
		m.Stage = *obj.Stage
	}
	if obj.Key != nil {
		m.Key = *obj.Key
	}
	if obj.OrderKey != nil {
		m.OrderKey = *obj.OrderKey
	}
	if obj.Payload != nil {
		m.Payload = []byte(*obj.Payload)
	}
	return m, nil
}

// FuzzPlainAgrees checks that whatever the plain path reads, the decoder reads
// as the same message, that Parse answers it, and that the plain path's
// message does not share memory with its input (pepsi-queue reuses its line
// buffer).
func FuzzPlainAgrees(f *testing.F) {
	for _, s := range []string{
		`{"stage": "a", "payload": "ingest"}`, `{"payload":""}`, ` { "key" : "k-1" , "payload" : "x y" } `,
		`{"payload": "x", "payload": "y"}`, `{"Payload": "x"}`, `{"payload": "\u0041"}`, `{"payload": "é"}`,
		`{"stage": "", "payload": "x"}`, `{"key": "", "payload": "x"}`, `{"payload": "x"} x`, `{"payload": "x",}`,
		`{"payload": "x", "state": {}}`, `{"stage": "a"}`, `{}`, "{\"payload\":\"x\"}\r\n", `{"payload": 1}`,
		`{"payload": "x", "order_key": "acct-9"}`, `{"order_key": "", "payload": "x"}`, `{"payload": "x", "order_key": "a", "order_key": "b"}`,
	} {
		for _, fl := range []Fields{{}, {Stage: true, Key: true, OrderKey: true, Limit: true}} {
			f.Add([]byte(s), fl.Stage, fl.Key, fl.OrderKey)
		}
	}
	f.Fuzz(func(t *testing.T, text []byte, stage, key, orderKey bool) {
		fl := Fields{Stage: stage, Key: key, OrderKey: orderKey, Limit: true}
		m, ok := parsePlain(text, fl)
		if !ok {
			return
		}
		want, err := decode(t, text, fl)
		if err != nil {
			t.Fatalf("plain path read %q as %+v; the decoder refuses it: %v", text, m, err)
		}
		if m.Stage != want.Stage || m.Key != want.Key || m.OrderKey != want.OrderKey || !bytes.Equal(m.Payload, want.Payload) || m.State != nil {
			t.Fatalf("plain path read %q as %+v; the decoder as %+v", text, m, want)
		}
		if m.Payload == nil || m.Stage != "" && !stage || m.Key != "" && !key || m.OrderKey != "" && !orderKey {
			t.Fatalf("plain path read %q as %+v with fields %+v", text, m, fl)
		}
		if got, err := Parse(text, fl); err != nil || got.Stage != m.Stage || got.Key != m.Key || got.OrderKey != m.OrderKey || !bytes.Equal(got.Payload, m.Payload) {
			t.Fatalf("Parse(%q) = %+v, %v; want %+v", text, got, err, m)
		}
		before := append([]byte(nil), m.Payload...)
		for i := range text {
			text[i] = '#'
		}
		if !bytes.Equal(m.Payload, before) {
			t.Fatalf("the payload %q changed with its input", before)
		}
	})
}

// TestPlainPathTakesTheCommonShape checks that the plain path does read the
// messages it is there for (else it would only cost time).
func TestPlainPathTakesTheCommonShape(t *testing.T) {
	for _, s := range []string{`{"stage": "a", "payload": "ingest"}`, `{"payload":"message 1","key":"order-1"}`, `{"payload":"debit 12.50","order_key":"acct-9"}`} {
		if _, ok := parsePlain([]byte(s), Fields{Stage: true, Key: true, OrderKey: true, Limit: true}); !ok {
			t.Errorf("%s: not read by the plain path", s)
		}
	}
	for _, s := range []string{`{"payload": "x", "state": {"n": 1}}`, `{"payload": "caf\u00e9"}`, `{"payload_base64": "AA=="}`} {
		if _, ok := parsePlain([]byte(s), Fields{Stage: true, Key: true}); ok {
			t.Errorf("%s: read by the plain path; want the decoder", s)
		}
	}
}
