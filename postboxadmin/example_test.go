package postboxadmin_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxsqlite"
)

func ExampleNew() {
	dir, err := os.MkdirTemp("", "postboxadmin")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := postboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	driver, _ := postboxsqlite.New(db)
	ctx := context.Background()
	m, _ := postboxmigrate.New(driver, nil)
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	client, err := postbox.NewClient(driver, nil)
	if err != nil {
		log.Fatal(err)
	}
	admin := client.Admin()

	srv, err := postboxadmin.New(&postboxadmin.Config{
		Admin:  admin,
		Tokens: []postboxadmin.Token{{Name: "ops", Value: "s3cret-token-for-the-example", Scope: postboxadmin.ScopeAdmin}},
	})
	if err != nil {
		log.Fatal(err)
	}
	// In production: srv.ListenAndServe(ctx, ":8081").
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/status", ""},
		{"POST", "/v1/dead/requeue", `{}`},
		{"POST", "/v1/replay", `{"since": "1h", "dry_run": true}`},
	} {
		r, _ := http.NewRequestWithContext(ctx, req.method, ts.URL+req.path, strings.NewReader(req.body))
		r.Header.Set("Authorization", "Bearer s3cret-token-for-the-example")
		res, err := ts.Client().Do(r)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		fmt.Printf("%s %s: %d\n", req.method, req.path, res.StatusCode)
		if res.StatusCode != 200 {
			fmt.Print(string(body))
		}
	}
	// Output:
	// GET /v1/status: 200
	// POST /v1/dead/requeue: 400
	// {
	//   "error": "no messages selected: give \"ids\" or a filter (\"topic\", \"key\", \"since\", \"until\"), or set \"all\": true to select every dead message"
	// }
	// POST /v1/replay: 200
}
