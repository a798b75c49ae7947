package postboxschema_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxschema"
)

func mustLoad(t *testing.T, opts *postboxschema.Options) *postboxschema.Registry {
	t.Helper()
	reg, err := postboxschema.Load("testdata/schemas", opts)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// checkRejected asserts err is a *postbox.ValidationError on field with
// exactly reason.
func checkRejected(t *testing.T, err error, field, reason string) {
	t.Helper()
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v (%T), want a *postbox.ValidationError", err, err)
	}
	if ve.Field != field {
		t.Errorf("Field = %q, want %q", ve.Field, field)
	}
	if ve.Reason != reason {
		t.Errorf("Reason =\n  %s\nwant\n  %s", ve.Reason, reason)
	}
}

func TestLoadTopics(t *testing.T) {
	reg := mustLoad(t, nil)
	want := []string{"orders.created", "payments.refunded", "users.signed_up"}
	if got := reg.Topics(); !slices.Equal(got, want) {
		t.Fatalf("Topics() = %v, want %v (money.json is shared, README.md and ignored/ are skipped)", got, want)
	}
}

func TestValidatePayload(t *testing.T) {
	reg := mustLoad(t, nil)
	for _, tc := range []struct {
		name, topic, payload string
		reason               string // "" means accepted
	}{
		{"valid", "orders.created", `{"id":"ord_1","amount":12.5,"currency":"EUR","items":[{"sku":"a","qty":2}]}`, ""},
		{"valid through a shared $ref", "payments.refunded", `{"order":"ord_1","amount":3,"reason":{"code":7},"note":null}`, ""},
		{"no schema for the topic", "audit.logged", `not even JSON`, ""},
		{"minimum", "orders.created", `{"id":"ord_1","amount":-1,"currency":"EUR"}`,
			`at /amount: must be >= 0 (minimum)`},
		{"multipleOf", "orders.created", `{"id":"ord_1","amount":1.001,"currency":"EUR"}`,
			`at /amount: must be a multiple of 0.01 (multipleOf)`},
		{"required", "orders.created", `{"amount":1}`,
			`at (root): missing properties "id", "currency" (required)`},
		{"type at the root", "orders.created", `[1,2]`,
			`at (root): must be object, not array (type)`},
		{"enum", "orders.created", `{"id":"ord_1","amount":1,"currency":"YEN"}`,
			`at /currency: must be one of "EUR", "GBP", "USD" (enum)`},
		{"pattern", "orders.created", `{"id":"order 1","amount":1,"currency":"EUR"}`,
			`at /id: must match the pattern "^ord_[0-9a-z]+$" (pattern)`},
		{"nested item", "orders.created", `{"id":"ord_1","amount":1,"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b"}]}`,
			`at /items/1: missing property "qty" (required)`},
		{"additionalProperties, sorted", "orders.created", `{"id":"ord_1","amount":1,"currency":"EUR","zeta":1,"alpha":2}`,
			`at (root): properties "alpha", "zeta" are not allowed (additionalProperties)`},
		{"first three violations, the rest counted", "orders.created", `{"id":"x","amount":"1","currency":"YEN","items":[{"sku":"","qty":0}]}`,
			`at /amount: must be number, not string (type); at /currency: must be one of "EUR", "GBP", "USD" (enum); at /id: must match the pattern "^ord_[0-9a-z]+$" (pattern); and 2 more violations`},
		{"oneOf matching none", "payments.refunded", `{"order":"o","amount":1,"reason":{"code":"x"}}`,
			`at /reason: must match exactly one schema of oneOf, matches none (must be string, not object | at /reason/code: must be integer, not string)`},
		{"anyOf", "payments.refunded", `{"order":"o","amount":1,"reason":"late","note":5}`,
			`at /note: must match at least one schema of anyOf (must be string, not number | must be null, not number)`},
		{"draft-07 asserts format", "users.signed_up", `{"email":"nobody"}`,
			`at /email: is not a valid email: missing @ (format)`},
		{"empty payload", "orders.created", ``, `is not JSON: empty input`},
		{"blank payload", "orders.created", " \n\t", `is not JSON: empty input`},
		{"not JSON", "orders.created", "{\"id\":\n  ord_1}", `is not JSON: invalid character 'o' looking for beginning of value (line 2, column 3)`},
		{"truncated", "orders.created", `{"id":"ord_1"`, `is not JSON: unexpected end of input`},
		{"two documents", "orders.created", `{} {}`, `is not JSON: more data after the JSON value (line 1, column 4)`},
		{"invalid UTF-8", "orders.created", "{\"id\":\"ord_\xff\"}", `is not JSON: not valid UTF-8 (line 1, column 12)`},
		{"huge exponent", "orders.created", `{"id":"ord_1","amount":1e9999999,"currency":"EUR"}`,
			`at /amount: number is beyond what can be checked (at most 256 characters and an exponent within ±1000)`},
		{"long number", "orders.created", `{"id":"ord_1","amount":` + strings.Repeat("9", 300) + `,"currency":"EUR"}`,
			`at /amount: number is beyond what can be checked (at most 256 characters and an exponent within ±1000)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := reg.ValidatePayload(tc.topic, []byte(tc.payload))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("rejected a valid payload: %v", err)
				}
				return
			}
			checkRejected(t, err, "payload", tc.reason)
		})
	}
}

func TestReasonIsDeterministic(t *testing.T) {
	reg := mustLoad(t, &postboxschema.Options{MaxViolations: 100})
	// Many violations in one object, whose keys the validator visits in map
	// order.
	var sb strings.Builder
	sb.WriteString(`{"id":1,"amount":"x","currency":2,"items":[`)
	for i := range 20 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku":%d,"qty":-%d,"x%d":true}`, i, i, i)
	}
	sb.WriteString(`],"b":1,"a":2,"c":3}`)
	payload := []byte(sb.String())
	first := reg.ValidatePayload("orders.created", payload)
	if first == nil {
		t.Fatal("accepted an invalid payload")
	}
	for range 50 {
		if err := reg.ValidatePayload("orders.created", payload); err.Error() != first.Error() {
			t.Fatalf("reason changed between runs:\n%v\n%v", first, err)
		}
	}
}

func TestMaxViolations(t *testing.T) {
	payload := []byte(`{"id":1,"amount":"x","currency":2,"extra":true}`)
	for _, tc := range []struct {
		max  int
		want int // violations listed
		more string
	}{
		{0, 3, "; and 1 more violation"},
		{1, 1, "; and 3 more violations"},
		{10, 4, ""},
	} {
		reg := mustLoad(t, &postboxschema.Options{MaxViolations: tc.max})
		var ve *postbox.ValidationError
		if err := reg.ValidatePayload("orders.created", payload); !errors.As(err, &ve) {
			t.Fatalf("MaxViolations %d: got %v", tc.max, err)
		}
		if got := strings.Count(ve.Reason, "at "); got != tc.want || !strings.HasSuffix(ve.Reason, tc.more) && tc.more != "" {
			t.Errorf("MaxViolations %d: %d violations in %q, want %d ending %q", tc.max, got, ve.Reason, tc.want, tc.more)
		}
	}
	if _, err := postboxschema.Load("testdata/schemas", &postboxschema.Options{MaxViolations: -1}); err == nil {
		t.Error("accepted MaxViolations -1")
	} else {
		checkRejected(t, err, "MaxViolations", "must not be negative")
	}
}

func TestRequireSchema(t *testing.T) {
	loose := mustLoad(t, nil)
	strict := mustLoad(t, &postboxschema.Options{RequireSchema: true})
	payload := []byte(`{"any":"thing"}`)
	if err := loose.ValidatePayload("audit.logged", payload); err != nil {
		t.Errorf("without RequireSchema, a topic without a schema was rejected: %v", err)
	}
	err := strict.ValidatePayload("audit.logged", payload)
	checkRejected(t, err, "topic", "has no schema, and schemas are required")
	var ve *postbox.ValidationError
	if errors.As(err, &ve) && ve.Value != "audit.logged" {
		t.Errorf("Value = %q, want the topic", ve.Value)
	}
	if err := strict.ValidatePayload("orders.created", []byte(`{"id":"ord_1","amount":0,"currency":"USD"}`)); err != nil {
		t.Errorf("with RequireSchema, a valid payload of a topic with a schema was rejected: %v", err)
	}
	var nilReg *postboxschema.Registry
	if err := nilReg.ValidatePayload("a", nil); err != nil || nilReg.Topics() != nil {
		t.Errorf("a nil Registry should check nothing: %v", err)
	}
}

func TestAssertFormat(t *testing.T) {
	schemas := map[string][]byte{"users.invited": []byte(`{"properties":{"email":{"format":"email"}}}`)}
	payload := []byte(`{"email":"nobody"}`)
	lax, err := postboxschema.New(schemas, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lax.ValidatePayload("users.invited", payload); err != nil {
		t.Errorf("draft 2020-12 treats format as an annotation by default, got %v", err)
	}
	strict, err := postboxschema.New(schemas, &postboxschema.Options{AssertFormat: true})
	if err != nil {
		t.Fatal(err)
	}
	checkRejected(t, strict.ValidatePayload("users.invited", payload), "payload", "at /email: is not a valid email: missing @ (format)")
}

func TestAssertContent(t *testing.T) {
	schemas := map[string][]byte{"files.stored": []byte(`{"properties":{"data":{"type":"string","contentEncoding":"base64"}}}`)}
	payload := []byte(`{"data":"***"}`)
	lax, err := postboxschema.New(schemas, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lax.ValidatePayload("files.stored", payload); err != nil {
		t.Errorf("content keywords are annotations by default, got %v", err)
	}
	strict, err := postboxschema.New(schemas, &postboxschema.Options{AssertContent: true})
	if err != nil {
		t.Fatal(err)
	}
	checkRejected(t, strict.ValidatePayload("files.stored", payload), "payload", "at /data: is not base64 encoded (contentEncoding)")
}

func TestDefaultDraft(t *testing.T) {
	// Draft 4's boolean exclusiveMinimum is no schema at all in 2020-12.
	schemas := map[string][]byte{"stock.counted": []byte(`{"properties":{"n":{"minimum":0,"exclusiveMinimum":true}}}`)}
	if _, err := postboxschema.New(schemas, nil); err == nil {
		t.Fatal("a draft-4 schema compiled as 2020-12")
	}
	reg, err := postboxschema.New(schemas, &postboxschema.Options{DefaultDraft: jsonschema.Draft4})
	if err != nil {
		t.Fatal(err)
	}
	checkRejected(t, reg.ValidatePayload("stock.counted", []byte(`{"n":0}`)), "payload", "at /n: must be > 0 (exclusiveMinimum)")
	if err := reg.ValidatePayload("stock.counted", []byte(`{"n":1}`)); err != nil {
		t.Error(err)
	}
}

func TestLoadReportsEveryBadFile(t *testing.T) {
	_, err := postboxschema.Load("testdata/bad", nil)
	var le *postboxschema.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("got %v (%T), want a *LoadError", err, err)
	}
	dir := filepath.Join("testdata", "bad")
	want := []struct{ name, reason string }{
		{"badref.schema.json", `cannot load "missing.json": not a file of the schema set; only its .json files can be referenced`},
		{"badregex.schema.json", "is not a valid schema: at /properties/id/pattern: is not a valid regex: error parsing regexp: missing closing ): `((` (format)"},
		{"broken.schema.json", `is not JSON: invalid character '}' after array element (line 4, column 1)`},
		{"orders!created.schema.json", `does not name a valid topic (<topic>.schema.json): has "!" at byte 6; only ASCII letters, digits and . _ : - are allowed`},
		{"orders.updated.json", `no topic schema refers to it; a topic's schema is named <topic>.schema.json`},
		{"remote.schema.json", `cannot load "https://example.com/schemas/order.json": not a file of the schema set; only its .json files can be referenced`},
		{"shared!.json", `shared schema files are named with letters, digits and . _ : - only`},
		{"wrongtype.schema.json", `is not a valid schema: at /properties/amount/type: must match at least one schema of anyOf (must be one of "array", "boolean", "integer", "null", "number", ... | must be array, not string)`},
	}
	if len(le.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(le.Problems), len(want), err)
	}
	for i, w := range want {
		if i >= len(le.Problems) {
			break
		}
		p := le.Problems[i]
		if p.Name != filepath.Join(dir, w.name) || p.Reason != w.reason {
			t.Errorf("problem %d:\n got  %s: %s\n want %s: %s", i, p.Name, p.Reason, filepath.Join(dir, w.name), w.reason)
		}
	}
	// The good file in the same directory is not blamed, and every problem
	// is reachable through errors.As.
	if strings.Contains(err.Error(), "good.schema.json") {
		t.Errorf("a valid schema was reported: %v", err)
	}
	var se *postboxschema.SchemaError
	if !errors.As(err, &se) || se.Name != filepath.Join(dir, "badref.schema.json") {
		t.Errorf("errors.As to *SchemaError gave %v", se)
	}
	if !strings.HasPrefix(err.Error(), "postboxschema: cannot load schemas (8 problems): ") {
		t.Errorf("message %q", err)
	}
}

func TestLoadFSNames(t *testing.T) {
	long := strings.Repeat("a", postbox.MaxTopicBytes+1)
	fsys := fstest.MapFS{
		".schema.json":         {Data: []byte(`{}`)},
		"a b.schema.json":      {Data: []byte(`{}`)},
		long + ".schema.json":  {Data: []byte(`{}`)},
		"ok.schema.json":       {Data: []byte(`{"$ref":"sub/x.json"}`)},
		"sub/x.json":           {Data: []byte(`{}`)},
		"sub/y.schema.json":    {Data: []byte(`not json, but ignored: in a subdirectory`)},
		"notes.txt":            {Data: []byte(`ignored`)},
		"empty.schema.json":    {Data: nil},
		"z:colon.schema.json":  {Data: []byte(`{"$ref":"./y:shared.json"}`)},
		"y:shared.json":        {Data: []byte(`{"type":"object"}`)},
		"null.schema.json":     {Data: []byte(`null`)},
		"trailing.schema.json": {Data: []byte(`{} x`)},
	}
	_, err := postboxschema.LoadFS(fsys, nil)
	var le *postboxschema.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("got %v", err)
	}
	got := map[string]string{}
	for _, p := range le.Problems {
		got[p.Name] = p.Reason
	}
	want := map[string]string{
		".schema.json":         "does not name a valid topic (<topic>.schema.json): is empty",
		"a b.schema.json":      "does not name a valid topic (<topic>.schema.json): has \" \" at byte 1; only ASCII letters, digits and . _ : - are allowed",
		long + ".schema.json":  "does not name a valid topic (<topic>.schema.json): is 256 bytes, over the limit of 255",
		"ok.schema.json":       `cannot load "sub/x.json": not a file of the schema set; only its .json files can be referenced`,
		"empty.schema.json":    "is not JSON: empty input",
		"null.schema.json":     "is not a valid schema: at (root): must be boolean or object, not null (type)",
		"trailing.schema.json": "is not JSON: more data after the JSON value (line 1, column 4)",
	}
	for name, reason := range want {
		if got[name] != reason {
			t.Errorf("%s:\n got  %q\n want %q", name, got[name], reason)
		}
	}
	if len(got) != len(want) {
		t.Errorf("problems %v, want only %d", got, len(want))
	}
}

func TestLoadDirectoryErrors(t *testing.T) {
	_, err := postboxschema.Load(filepath.Join(t.TempDir(), "missing"), nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: got %v, want fs.ErrNotExist", err)
	}
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "README.md"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := postboxschema.Load(empty, nil); err == nil || !strings.Contains(err.Error(), "no topic schemas") {
		t.Errorf("directory without schemas: got %v", err)
	}
	unreadable := t.TempDir()
	p := filepath.Join(unreadable, "a.schema.json")
	if err := os.Mkdir(p+".d", 0o700); err != nil { // a directory is skipped, whatever its name
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(unreadable, "nowhere"), p); err != nil {
		t.Fatal(err)
	}
	_, err = postboxschema.Load(unreadable, nil)
	var le *postboxschema.LoadError
	if !errors.As(err, &le) || len(le.Problems) != 1 || le.Problems[0].Name != p || !strings.HasPrefix(le.Problems[0].Reason, "cannot be read: ") {
		t.Errorf("dangling symlink: got %v", err)
	}
}

func TestNew(t *testing.T) {
	reg, err := postboxschema.New(map[string][]byte{
		"orders.created":   []byte(`{"type":"object","required":["order"],"properties":{"order":{"$ref":"orders.shared.schema.json#/$defs/order"}}}`),
		"orders.shared":    []byte(`{"$defs":{"order":{"type":"string","minLength":3}}}`),
		"orders.cancelled": []byte(`true`),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.Topics(); !slices.Equal(got, []string{"orders.cancelled", "orders.created", "orders.shared"}) {
		t.Errorf("Topics() = %v", got)
	}
	checkRejected(t, reg.ValidatePayload("orders.created", []byte(`{"order":"ab"}`)), "payload", "at /order: must be at least 3 characters long, is 2 (minLength)")
	if err := reg.ValidatePayload("orders.cancelled", []byte(`[1]`)); err != nil {
		t.Errorf("the true schema accepts any JSON: %v", err)
	}

	_, err = postboxschema.New(map[string][]byte{
		"bad topic":   []byte(`{}`),
		"bad.json":    []byte(`{`),
		"bad.schema":  []byte(`{"minimum":"zero"}`),
		"bad.ref":     []byte(`{"$ref":"other.schema.json"}`),
		"good.schema": []byte(`{}`),
	}, nil)
	var le *postboxschema.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("got %v", err)
	}
	var names []string
	for _, p := range le.Problems {
		names = append(names, p.Name)
	}
	if want := []string{`"bad topic"`, "bad.json", "bad.ref", "bad.schema"}; !slices.Equal(names, want) {
		t.Errorf("problems named %q, want %q:\n%v", names, want, err)
	}
	if reg, err := postboxschema.New(nil, nil); err != nil || len(reg.Topics()) != 0 {
		t.Errorf("New(nil): %v, %v", reg, err)
	}
}

func TestHugeNumberInSchema(t *testing.T) {
	// The validator cannot hold this number and would drop the keyword,
	// accepting everything: loading reports it instead.
	_, err := postboxschema.New(map[string][]byte{"a": []byte(`{"properties":{"n":{"minimum":1e9999999}}}`)}, nil)
	want := "postboxschema: cannot load schemas (1 problem): a: at /properties/n/minimum: number is beyond what can be checked (at most 256 characters and an exponent within ±1000)"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}

func TestConcurrentUse(t *testing.T) {
	reg := mustLoad(t, nil)
	good := []byte(`{"id":"ord_1","amount":1,"currency":"EUR"}`)
	bad := []byte(`{"id":"ord_1","amount":-1,"currency":"EUR","x":1}`)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				p := good
				if (g+i)%2 == 1 {
					p = bad
				}
				err := reg.ValidatePayload("orders.created", p)
				if (err == nil) != (p[len(p)-2] == '"') {
					errs <- fmt.Errorf("payload %s: %w", p, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
