package postboxadmin_test

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxadmin"
)

// TestEndpoints walks every endpoint's success path, on PostgreSQL and on
// SQLite.
func TestEndpoints(t *testing.T) {
	for name, setup := range map[string]func(testing.TB) *fixture{"postgres": postgresFixture, "sqlite": sqliteFixture} {
		t.Run(name, func(t *testing.T) {
			f := setup(t)
			a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens()})
			testEndpoints(t, f, a)
		})
	}
}

func testEndpoints(t *testing.T, f *fixture, a *api) {
	if r := a.must(t, 200, "GET", "/healthz", "", ""); r.json["status"] != "ok" {
		t.Fatalf("healthz: %s", r)
	}
	if r := a.must(t, 200, "GET", "/readyz", "", ""); r.json["status"] != "ready" {
		t.Fatalf("readyz: %s", r)
	}

	st := a.must(t, 200, "GET", "/v1/status", readToken, "")
	if st.json["pending"] != 1.0 || st.json["dead"] != 3.0 || st.json["published_kept"] != 2.0 {
		t.Fatalf("status: %s", st)
	}
	// Null, or the oldest snapshot another session holds (other tests'
	// sessions share the database).
	if h, ok := st.json["held_snapshot"]; !ok {
		t.Fatalf("status without held_snapshot: %s", st)
	} else if m, isObj := h.(map[string]any); h != nil && (!isObj || m["pid"] == nil || m["age_seconds"] == nil || m["state"] == nil) {
		t.Fatalf("status held_snapshot: %s", st)
	}
	topics := list(t, st, "topics")
	if len(topics) != 3 || topics[2]["topic"] != "orders.refunded" || topics[2]["dead"] != 2.0 || topics[1]["pending"] != 1.0 {
		t.Fatalf("status topics: %s", st)
	}
	if r := a.do(t, "HEAD", "/v1/status", readToken, ""); r.status != 200 || len(r.body) != 0 {
		t.Fatalf("HEAD status: %d %q", r.status, r.body)
	}

	// Listing, with the payload as base64 and, when it is text, as text.
	dead := list(t, a.must(t, 200, "GET", "/v1/dead", readToken, ""), "messages")
	if len(dead) != 3 {
		t.Fatalf("dead: %d messages", len(dead))
	}
	for _, d := range dead {
		raw, err := base64.StdEncoding.DecodeString(d["payload"].(string))
		if err != nil {
			t.Fatalf("payload of %v: %v", d["key"], err)
		}
		text, hasText := d["payload_text"].(string)
		switch d["key"] {
		case "o4":
			if !bytes.Equal(raw, poisonBinary) || hasText {
				t.Errorf("binary payload: %q, payload_text %v", raw, d["payload_text"])
			}
		default:
			if !bytes.Equal(raw, poisonText) || text != string(poisonText) {
				t.Errorf("text payload: %q, payload_text %q", raw, text)
			}
		}
		if d["last_error"] != "rejected by the broker" || d["attempts"] != 1.0 || d["id"] != f.dead[d["key"].(string)] {
			t.Errorf("dead message: %v", d)
		}
		for _, k := range []string{"created_at", "dead_at"} {
			if _, err := time.Parse(time.RFC3339, d[k].(string)); err != nil || !strings.HasSuffix(d[k].(string), "Z") {
				t.Errorf("%s %v: not RFC 3339 UTC", k, d[k])
			}
		}
		if h := d["headers"].(map[string]any); h["ce-source"] == nil {
			t.Errorf("headers: %v", h)
		}
	}
	for q, want := range map[string]int{
		"topic=orders.refunded": 2, "key=o3": 1, "topic=orders.refunded&key=o3": 0, "since=1h": 3, "until=1h": 0, "limit=1": 1,
		"since=" + url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339)) + "&until=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339)): 3,
	} {
		if got := list(t, a.must(t, 200, "GET", "/v1/dead?"+q, readToken, ""), "messages"); len(got) != want {
			t.Errorf("dead?%s: %d messages, want %d", q, len(got), want)
		}
	}
	one := a.must(t, 200, "GET", "/v1/dead/"+f.dead["o3"], readToken, "")
	if one.json["id"] != f.dead["o3"] || one.json["topic"] != "orders.created" || one.json["seq"] == nil {
		t.Fatalf("dead/{id}: %s", one)
	}

	// Requeue by id, delete by filter, then the rest with all.
	if r := a.must(t, 200, "POST", "/v1/dead/requeue", adminToken, `{"ids":["`+f.dead["o3"]+`"]}`); r.json["count"] != 1.0 {
		t.Fatalf("requeue: %s", r)
	}
	if r := a.must(t, 200, "GET", "/v1/status", adminToken, ""); r.json["pending"] != 2.0 || r.json["dead"] != 2.0 {
		t.Fatalf("status after requeue: %s", r)
	}
	if r := a.must(t, 200, "POST", "/v1/dead/delete", adminToken, `{"topic":"orders.refunded","key":"o4","since":"1h"}`); r.json["count"] != 1.0 {
		t.Fatalf("delete by filter: %s", r)
	}
	if r := a.must(t, 200, "POST", "/v1/dead/requeue", adminToken, `{"all":true}`); r.json["count"] != 1.0 {
		t.Fatalf("requeue all: %s", r)
	}
	if r := a.must(t, 200, "POST", "/v1/dead/delete", adminToken, `{"all":true}`); r.json["count"] != 0.0 {
		t.Fatalf("delete all of none: %s", r)
	}
	a.must(t, 404, "GET", "/v1/dead/"+f.dead["o3"], readToken, "")

	// Replay: a dry run, then a real one; both audited with the token's name.
	r := a.must(t, 200, "POST", "/v1/replay", adminToken, `{"since":"1h","dry_run":true}`)
	if r.json["count"] != 2.0 || r.json["dry_run"] != true || r.json["actor"] != adminName {
		t.Fatalf("replay dry run: %s", r)
	}
	r = a.must(t, 200, "POST", "/v1/replay", adminToken, `{"since":"1h","until":"`+time.Now().Add(time.Minute).Format(time.RFC3339)+`","topic":"orders.paid","key":"o2"}`)
	if r.json["count"] != 1.0 || r.json["dry_run"] != false || r.json["topic"] != "orders.paid" {
		t.Fatalf("replay: %s", r)
	}
	replays := list(t, a.must(t, 200, "GET", "/v1/replays", readToken, ""), "replays")
	if len(replays) != 2 || replays[0]["actor"] != adminName || replays[0]["dry_run"] != false || replays[0]["count"] != 1.0 ||
		replays[1]["dry_run"] != true || replays[0]["key"] != "o2" {
		t.Fatalf("replays: %v", replays)
	}
	if got := list(t, a.must(t, 200, "GET", "/v1/replays?limit=1", readToken, ""), "replays"); len(got) != 1 {
		t.Fatalf("replays?limit=1: %v", got)
	}

	// Prune: nothing is old enough, then everything published is.
	if r := a.must(t, 200, "POST", "/v1/prune", adminToken, ""); r.json["deleted"] != 0.0 {
		t.Fatalf("prune: %s", r)
	}
	f.agePublished(t)
	if r := a.must(t, 200, "POST", "/v1/prune", adminToken, "{}"); r.json["deleted"] != 1.0 {
		t.Fatalf("prune of aged rows: %s", r)
	}

	// Consumer dead letters, one of them under a name with a slash.
	letters := list(t, a.must(t, 200, "GET", "/v1/consumers/dead", readToken, ""), "dead_letters")
	if len(letters) != 2 {
		t.Fatalf("consumer dead letters: %v", letters)
	}
	if got := list(t, a.must(t, 200, "GET", "/v1/consumers/dead?consumer=billing&topic=orders.paid&since=1h&limit=5", readToken, ""), "dead_letters"); len(got) != 1 || got[0]["message_id"] != "m-1" {
		t.Fatalf("consumer dead letters of billing: %v", got)
	}
	path := "/v1/consumers/" + url.PathEscape("shipping/eu") + "/dead/" + url.PathEscape("m 2")
	dl := a.must(t, 200, "GET", path, readToken, "")
	if dl.json["consumer"] != "shipping/eu" || dl.json["message_id"] != "m 2" || dl.json["payload_text"] != "x" ||
		dl.json["error"] != "handler refused" || dl.json["headers"].(map[string]any)["trace"] != "abc" {
		t.Fatalf("consumer dead letter: %s", dl)
	}
	if r := a.must(t, 200, "DELETE", path, adminToken, ""); r.json["count"] != 1.0 {
		t.Fatalf("delete consumer dead letter: %s", r)
	}
	a.must(t, 404, "DELETE", path, adminToken, "")
	a.must(t, 404, "GET", path, readToken, "")
}
