package postboxadmin_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/postbox-go/postbox/postboxadmin"
)

// kind is a field's documented JSON type.
type kind int

const (
	kString kind = iota
	kStrings
	kBool
)

// fuzzEndpoints are the POST endpoints and the fields of their documented
// bodies. Prune takes an empty body or an empty object.
var fuzzEndpoints = []struct {
	path       string
	fields     map[string]kind
	allowEmpty bool
}{
	{"/v1/dead/requeue", map[string]kind{"ids": kStrings, "topic": kString, "key": kString, "since": kString, "until": kString, "all": kBool}, false},
	{"/v1/dead/delete", map[string]kind{"ids": kStrings, "topic": kString, "key": kString, "since": kString, "until": kString, "all": kBool}, false},
	{"/v1/replay", map[string]kind{"since": kString, "until": kString, "topic": kString, "key": kString, "dry_run": kBool}, false},
	{"/v1/prune", map[string]kind{}, true},
}

// documentedShape reports whether body decodes into the documented shape
// of an endpoint's body: one JSON object whose fields are all documented
// (exact names) and of their type, null standing for absent.
func documentedShape(body []byte, fields map[string]kind, allowEmpty bool) bool {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return allowEmpty
	}
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	if body[0] != '{' || dec.Decode(&obj) != nil || dec.More() {
		return false
	}
	var rest any
	if dec.Decode(&rest) == nil {
		return false
	}
	if !uniqueFields(body) {
		return false
	}
	for name, v := range obj {
		k, ok := fields[name]
		if !ok {
			return false
		}
		switch v := v.(type) {
		case nil:
		case string:
			if k != kString {
				return false
			}
		case bool:
			if k != kBool {
				return false
			}
		case []any:
			if k != kStrings {
				return false
			}
			for _, e := range v {
				if _, ok := e.(string); !ok {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

// uniqueFields reports whether the JSON object body names no field twice.
func uniqueFields(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		k, _ := t.(string)
		var v json.RawMessage
		if seen[k] || dec.Decode(&v) != nil {
			return false
		}
		seen[k] = true
	}
	return true
}

// FuzzAdminRequest posts arbitrary bodies to the POST endpoints, against
// the real database: no body may cause a 5xx, a 2xx only answers a body of
// the documented shape, and every other answer is a JSON error.
func FuzzAdminRequest(f *testing.F) {
	fx := postgresFixture(f)
	srv, err := postboxadmin.New(&postboxadmin.Config{Admin: fx.admin, ConsumerDead: fx.inbox, Tokens: tokens(), Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	for i := range fuzzEndpoints {
		f.Add(uint8(i), []byte(`{}`))
	}
	f.Fuzz(func(t *testing.T, endpoint uint8, body []byte) {
		e := fuzzEndpoints[int(endpoint)%len(fuzzEndpoints)]
		req := httptest.NewRequest(http.MethodPost, e.path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("POST %s %q: %d %s", e.path, body, rec.Code, rec.Body)
		case rec.Code < 300 && !documentedShape(body, e.fields, e.allowEmpty):
			t.Fatalf("POST %s %q: %d for a body that is not the documented shape: %s", e.path, body, rec.Code, rec.Body)
		case rec.Code >= 300:
			var eb struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &eb) != nil || eb.Error == "" {
				t.Fatalf("POST %s %q: %d without a JSON error: %s", e.path, body, rec.Code, rec.Body)
			}
		}
	})
}
