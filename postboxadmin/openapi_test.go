package postboxadmin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxpgx"
)

// openAPIDoc is the served document, decoded.
type openAPIDoc struct {
	Paths map[string]map[string]struct {
		Responses map[string]struct {
			Ref     string                     `json:"$ref"`
			Content map[string]json.RawMessage `json:"content"`
		} `json:"responses"`
	} `json:"paths"`
}

var methods = []string{"get", "post", "put", "patch", "delete"}

// TestOpenAPIMatchesHandlers holds the OpenAPI document to the real
// handlers: it documents every route the server registers and no other,
// and for every status it documents for an operation, a request that gets
// that status gets it, with a body of the documented media type that
// validates against the documented schema.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	raw := postboxadmin.OpenAPI()
	var doc openAPIDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var head struct {
		OpenAPI string `json:"openapi"`
	}
	if err := json.Unmarshal(raw, &head); err != nil || head.OpenAPI != "3.1.0" {
		t.Fatalf("openapi = %q, %v", head.OpenAPI, err)
	}

	// The servers: each gives some statuses.
	f := postgresFixture(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte("postbox_pending 1\n"))
	})
	window := func(_ context.Context, topic string) (time.Duration, string, error) {
		if topic == "orders.paid" {
			return time.Hour, "JetStream stream ORDERS", nil
		}
		return 0, "", nil
	}
	main := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens(), Metrics: metrics, DedupeWindow: window})
	open := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Metrics: metrics})
	small := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens(), MaxBodyBytes: 16})
	noConsumers := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	notReady := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Ready: func(context.Context) error { return errors.New("relay not started") }})
	unmigratedClient, err := postbox.NewClient(postboxpgx.New(testdb.Pool(t)), &postbox.Config{Prefix: testdb.Prefix(t) + "none_"})
	if err != nil {
		t.Fatal(err)
	}
	unmigrated := serve(t, &postboxadmin.Config{Admin: unmigratedClient.Admin(), ConsumerDead: unmigratedClient.Inbox(), Tokens: tokens()})
	pool := testdb.Pool(t)
	brokenClient, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: testdb.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	broken := serve(t, &postboxadmin.Config{Admin: brokenClient.Admin(), ConsumerDead: brokenClient.Inbox(), Tokens: tokens()})

	// Every route is documented, and nothing else.
	var registered []string
	for _, p := range postboxadmin.Patterns(main.srv) {
		method, path, _ := strings.Cut(p, " ")
		registered = append(registered, strings.ToLower(method)+" "+strings.TrimSuffix(path, "{$}"))
	}
	var documented []string
	for path, item := range doc.Paths {
		for _, m := range methods {
			if _, ok := item[m]; ok {
				documented = append(documented, m+" "+path)
			}
		}
	}
	slices.Sort(registered)
	slices.Sort(documented)
	if !slices.Equal(registered, documented) {
		t.Fatalf("routes\nregistered %v\ndocumented %v", registered, documented)
	}

	// A request that succeeds, per operation; the ids are the fixture's.
	deadID := f.dead["o3"]
	type request struct {
		path, body string
		token      string // admin unless set
	}
	success := map[string]request{
		"get /v1/status":                            {path: "/v1/status"},
		"get /v1/dead":                              {path: "/v1/dead?topic=orders.refunded&limit=5"},
		"get /v1/dead/{id}":                         {path: "/v1/dead/" + deadID},
		"post /v1/dead/requeue":                     {path: "/v1/dead/requeue", body: fmt.Sprintf(`{"ids": [%q]}`, postbox.NewID())},
		"post /v1/dead/delete":                      {path: "/v1/dead/delete", body: fmt.Sprintf(`{"ids": [%q]}`, postbox.NewID())},
		"post /v1/replay":                           {path: "/v1/replay", body: `{"since": "1h", "topic": "orders.created", "dry_run": true}`},
		"get /v1/replays":                           {path: "/v1/replays"},
		"post /v1/prune":                            {path: "/v1/prune", body: `{}`},
		"get /v1/consumers/dead":                    {path: "/v1/consumers/dead?consumer=billing"},
		"post /v1/consumers/dead/requeue":           {path: "/v1/consumers/dead/requeue", body: `{"consumer": "billing", "ids": ["m-404"]}`},
		"post /v1/consumers/dead/delete":            {path: "/v1/consumers/dead/delete", body: `{"consumer": "billing", "ids": ["m-404"]}`},
		"get /v1/consumers/{consumer}/dead/{id}":    {path: "/v1/consumers/billing/dead/m-1"},
		"delete /v1/consumers/{consumer}/dead/{id}": {path: "/v1/consumers/billing/dead/m-1"},
		"get /healthz":                              {path: "/healthz"},
		"get /readyz":                               {path: "/readyz"},
		"get /metrics":                              {path: "/metrics"},
		"get /v1/openapi.json":                      {path: "/v1/openapi.json"},
	}
	notFound := map[string]string{
		"get /v1/dead/{id}":                         "/v1/dead/" + postbox.NewID(),
		"get /v1/consumers/{consumer}/dead/{id}":    "/v1/consumers/billing/dead/m-404",
		"delete /v1/consumers/{consumer}/dead/{id}": "/v1/consumers/billing/dead/m-404",
	}

	compiler := jsonschema.NewCompiler()
	compiler.AssertFormat()
	compiler.AssertContent()
	whole, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := compiler.AddResource("file:///openapi.json", whole); err != nil {
		t.Fatal(err)
	}
	pointer := func(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }

	type exchange struct {
		key, status string
		a           *api
		method      string
		req         request
		headers     []string
	}
	var plan []exchange
	for _, key := range documented {
		method, path, _ := strings.Cut(key, " ")
		ok, found := success[key]
		if !found {
			t.Fatalf("no successful request for %s", key)
		}
		for status := range doc.Paths[path][method].Responses {
			e := exchange{key: key, status: status, a: main, method: strings.ToUpper(method), req: ok}
			switch status {
			case "200", "202":
				if path == "/readyz" || path == "/metrics" {
					e.a = open // loopback, no token needed either way
				}
			case "400":
				e.req.path += map[bool]string{true: "&", false: "?"}[strings.Contains(ok.path, "?")] + "bogus=1"
			case "401":
				e.req.token = "none"
			case "403":
				e.a, e.headers = open, []string{"Host", "evil.example"}
			case "404":
				switch {
				case path == "/metrics":
					e.a = noConsumers
				case notFound[key] == "":
					t.Fatalf("no 404 request for %s", key)
				default:
					e.req.path = notFound[key]
				}
			case "409":
				e.req.body = `{"since": "1h"}`
			case "413":
				e.a = small
				e.req.body = `{"ids": ["` + strings.Repeat("a", 64) + `"]}`
			case "422":
				e.req.body = `{"since": "30d"}`
			case "500":
				e.a = broken
			case "501":
				e.a = noConsumers
			case "503":
				e.a = unmigrated
				if path == "/readyz" {
					e.a = notReady
				}
			default:
				t.Fatalf("%s documents %s, which this test cannot make happen", key, status)
			}
			plan = append(plan, e)
		}
	}
	// Reads first, so that the one delete that succeeds comes after them.
	slices.SortStableFunc(plan, func(a, b exchange) int {
		rank := func(e exchange) int {
			if e.method == "GET" {
				return 0
			}
			return 1
		}
		return rank(a) - rank(b)
	})
	seen := map[string]bool{}
	for _, e := range plan {
		token := adminToken
		switch e.req.token {
		case "none":
			token = ""
		case "":
		default:
			token = e.req.token
		}
		if e.a == open {
			token = ""
		}
		r := e.a.do(t, e.method, e.req.path, token, e.req.body, e.headers...)
		name := fmt.Sprintf("%s %s %s", e.method, e.req.path, e.req.body)
		if fmt.Sprint(r.status) != e.status {
			t.Errorf("%s: status %d, want the documented %s\n%s", name, r.status, e.status, r.body)
			continue
		}
		seen[e.key+" "+e.status] = true
		method, path, _ := strings.Cut(e.key, " ")
		resp := doc.Paths[path][method].Responses[e.status]
		loc := "file:///openapi.json#/paths/" + pointer(path) + "/" + method + "/responses/" + e.status
		content := resp.Content
		if resp.Ref != "" {
			var comps struct {
				Components struct {
					Responses map[string]struct {
						Content map[string]json.RawMessage `json:"content"`
					} `json:"responses"`
				} `json:"components"`
			}
			_ = json.Unmarshal(raw, &comps)
			name := strings.TrimPrefix(resp.Ref, "#/components/responses/")
			content = comps.Components.Responses[name].Content
			loc = "file:///openapi.json#/components/responses/" + pointer(name)
		}
		ct, _, _ := strings.Cut(r.header.Get("Content-Type"), ";")
		if _, ok := content[ct]; !ok {
			t.Errorf("%s: content type %s, documented %v", name, ct, slices.Collect(maps.Keys(content)))
			continue
		}
		if ct != "application/json" {
			continue
		}
		sch, err := compiler.Compile(loc + "/content/" + pointer(ct) + "/schema")
		if err != nil {
			t.Fatalf("%s: compile the documented schema: %v", name, err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s: %d body does not match the document: %v\n%s", name, r.status, err, r.body)
		}
	}
	for _, e := range plan {
		if !seen[e.key+" "+e.status] {
			t.Errorf("%s: documented status %s not seen", e.key, e.status)
		}
	}
	if len(seen) < 80 {
		t.Errorf("only %d documented answers exercised", len(seen))
	}
}

// The document is served as it is embedded, to anyone.
func TestOpenAPIServed(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	r := a.must(t, 200, "GET", "/v1/openapi.json", "", "")
	if !bytes.Equal(r.body, postboxadmin.OpenAPI()) {
		t.Fatal("served document differs from OpenAPI()")
	}
}
