package postboxidem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxidem"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A retried POST creates one order and publishes one message: the order,
// the outbox message and the stored response commit in one transaction.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	prefix := fmt.Sprintf("example_idem_%d_", os.Getpid())
	defer dropTables(pool, prefix)

	driver := postboxpgx.New(pool)
	m, _ := postboxmigrate.New(driver, &postboxmigrate.Config{Prefix: prefix})
	if _, err := m.Up(ctx); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+prefix+"orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item text NOT NULL)"); err != nil {
		panic(err)
	}
	client, _ := postbox.NewClient(driver, &postbox.Config{Prefix: prefix})
	idem, err := postboxidem.New(driver, &postboxidem.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}

	createOrder := func(w http.ResponseWriter, r *http.Request) {
		tx, _ := postboxidem.TxFromContext[pgx.Tx](r.Context())
		body, _ := io.ReadAll(r.Body)
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+prefix+"orders (item) VALUES ($1) RETURNING id", string(body)).Scan(&id); err != nil {
			http.Error(w, "could not create the order", http.StatusInternalServerError)
			return
		}
		msg := postbox.Message{Topic: "orders.created", Key: strconv.FormatInt(id, 10), Payload: body}
		if err := client.WriteTx(r.Context(), tx, msg); err != nil {
			http.Error(w, "could not create the order", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idem.Handler(http.HandlerFunc(createOrder)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, item string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(item))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			var problem struct{ Code string }
			_ = json.Unmarshal(body, &problem)
			body = []byte(problem.Code)
		}
		fmt.Printf("%d replayed=%t %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", body)
	}
	post("order-7f3a", "book") // runs the handler
	post("order-7f3a", "book") // a retry: the stored response
	post("order-7f3a", "pen")  // the same key for another request

	stats, _ := client.Stats(ctx)
	fmt.Println("outbox messages:", stats.Pending)
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 201 replayed=false {"order":1}
	// 201 replayed=true {"order":1}
	// 422 replayed=false fingerprint_mismatch
	// outbox messages: 1
}

func databaseURL() string {
	if u := os.Getenv("POSTBOX_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

func dropTables(pool *pgxpool.Pool, prefix string) {
	ctx := context.Background()
	rows, _ := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`, prefix)
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	if len(names) > 0 {
		_, _ = pool.Exec(ctx, "DROP TABLE "+strings.Join(names, ", ")+" CASCADE")
	}
}
