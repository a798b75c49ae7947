// Package postboxidem is an HTTP middleware for the Idempotency-Key header
// (IETF draft "The Idempotency-Key HTTP Header Field"), with its records in
// the service's own database, so that a retried POST runs once and
// publishes once.
//
// A client that sends a POST or PATCH with a key it chose may send it again
// (a timeout, a lost connection, a crash of its own) and get the first
// request's response instead of a second execution. The records live in
// the table {prefix}idempotency (migration 3 of postboxmigrate, on
// PostgreSQL and SQLite), shared by every replica of the service.
//
// # One transaction
//
// The handler runs inside a transaction that the middleware opens and
// hands to it through the request's context:
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx, _ := postboxidem.TxFromContext[pgx.Tx](r.Context())
//		// INSERT INTO orders ... with tx
//		if err := client.WriteTx(r.Context(), tx, postbox.Message{Topic: "orders.created", ...}); err != nil {
//			http.Error(w, "could not create the order", http.StatusInternalServerError)
//			return
//		}
//		w.WriteHeader(http.StatusCreated)
//	}
//
// The response is recorded in that same transaction just before it
// commits, so the domain rows, the outbox messages and the record commit
// together or not at all. A retry therefore finds either the record (and
// replays it: nothing runs, nothing is published) or nothing committed at
// all (and runs the handler as if for the first time). The response
// reaches the client only after the commit: a response sent earlier could
// announce an outcome that then rolls back. Work the handler does outside
// the transaction (another database, a call to another service) is not
// covered: it can happen twice.
//
// Before the handler runs, the key is claimed in a short statement of its
// own, committed at once, so that duplicates arriving meanwhile on any
// replica see the claim and get 409.
//
// # Semantics
//
//	request                                          response
//	-----------------------------------------------  ---------------------------------------------------
//	method not in Config.Methods (default POST,      passed through untouched
//	  PATCH), or no key and Config.Required unset
//	no key, Config.Required set                      400 key_missing
//	key malformed, or the header repeated            400 key_invalid
//	body over Config.MaxBodyBytes (2 MiB)            413 body_too_large; nothing runs
//	first request with a key                         the handler runs; its response is stored (below)
//	the same key and body again, completed           the stored status, headers and body, with
//	                                                   Idempotent-Replayed: true
//	the same key, another body                       422 fingerprint_mismatch
//	the same key while the first is running          409 in_progress, Retry-After: seconds until the
//	                                                   claim expires (at least 1)
//	the same key, first response over                409 response_not_stored, Idempotent-Replayed: true,
//	  Config.MaxResponseBytes (1 MiB)                  original_status in the body; nothing runs
//	the store fails                                  503 store_unavailable, Retry-After: 1; nothing
//	                                                   committed
//
// What is stored depends on the handler's status:
//
//   - 2xx, 3xx and 4xx (but for the three below) are answers to the
//     request: the handler's transaction commits with the record, and
//     every retry within Config.TTL (24 h from completion) replays them.
//     This follows the draft, which has a retry get the result of the
//     completed request, success or error, and Stripe, which stores every
//     non-5xx outcome. A 400 replayed for the same body is what running it
//     again would say.
//   - 5xx, and 408, 425 and 429 (which say "not now" rather than "not
//     this"), are released: the transaction rolls back, the record is
//     marked failed, and a retry with the same body runs the handler again.
//     The live caller gets the handler's response as it was.
//   - A panic rolls back and releases the same way, then goes on unwinding
//     to the server or a recovery middleware.
//
// A 2xx is never turned into a re-executable failure: once the handler's
// transaction has committed, the record says succeeded in the same commit.
// If the commit itself fails, nothing of it exists and the retry runs the
// handler against a database where it never ran.
//
// # Responses too large to keep
//
// The live caller always receives the full body. A body over
// Config.MaxResponseBytes is not kept: the record stores the status and a
// sentinel meaning "completed, response too large to replay". A retry then
// gets 409 with the code response_not_stored and the original status,
// never a second run: the request's effects are committed, and only the
// client can find out what it needs (with a GET of the resource it
// created, say). The 409 carries no Retry-After, since waiting changes
// nothing. The whole response is held in memory until the commit, however
// large, because no byte of it may leave before the commit.
//
// # Replayed headers
//
// A replay carries the stored status, body and headers, except the
// hop-by-hop headers (Connection and the ones it names, Keep-Alive,
// Transfer-Encoding, Upgrade, TE, Trailer, Proxy-*), Set-Cookie (a cookie
// is issued to one client at one moment, and anyone holding the key would
// get it again), Content-Length and Date (recomputed), and trailers. It adds
// Idempotent-Replayed: true.
//
// # The key
//
// The Idempotency-Key header holds a Structured Field String, "like-this",
// or the same text bare, like-this; both name one key (see ParseKey). The
// record is found by SHA-256 of the method, the escaped path, the raw query
// verbatim, the caller's identity (Config.Identity) and the key, so the
// same key on two routes, two queries or two callers names two records. A
// multi-tenant service must set Config.Identity, and run the middleware
// after authentication; without it, one caller's key can replay another
// caller's response. The request body is fingerprinted with SHA-256.
//
// # Crashes and slow handlers
//
// A server that dies mid-request leaves its claim "processing": its
// transaction never committed, so nothing of the request exists. Duplicates
// get 409 until Config.ClaimExpiry (1 min) has passed since the claim; then
// the first retry takes the claim over, in one statement on the locked row,
// so two retries cannot both take it, and runs the handler once.
//
// A handler still running when its claim expires may be overtaken the same
// way. Only one of the two commits: the record is written fenced by the
// claim's token, so the run that lost its claim finds the record changed,
// rolls back its transaction, and answers as a duplicate would. Keep
// ClaimExpiry above the longest handler run to avoid the wasted work.
//
// The transaction's context is the request's without its cancellation:
// once the handler has returned, its work and the record commit even if the
// client has gone, and the client's retry replays them. The handler itself
// gets the request's context and may stop early when the client leaves.
//
// # Using it
//
// New builds the middleware for one policy; build one per policy (one with
// Required set for the routes that demand a key, say), all over the same
// table. Handler has the usual signature, func(http.Handler) http.Handler:
//
//	idem, err := postboxidem.New(postboxpgx.New(pool), &postboxidem.Config{
//		Identity: func(r *http.Request) string { return userFrom(r.Context()) },
//	})
//
//	// net/http ServeMux, per route or around the whole mux:
//	mux.Handle("POST /orders", idem.Handler(http.HandlerFunc(createOrder)))
//	http.ListenAndServe(addr, idem.Handler(mux))
//
//	// chi:
//	r.Use(idem.Handler)
//
//	// echo, whose handlers return their errors to be written after the
//	// middleware chain has returned: write them inside it, or the
//	// middleware stores an empty 200 for a request that failed.
//	e.Use(echo.WrapMiddleware(idem.Handler))
//	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
//		return func(c echo.Context) error {
//			if err := next(c); err != nil {
//				c.Error(err)
//			}
//			return nil
//		}
//	})
//	// in a handler: tx, _ := postboxidem.TxFromContext[pgx.Tx](c.Request().Context())
//
// Behind http.StripPrefix, the path hashed is the stripped one; two mounts
// of one handler then share their keys, so wrap outside StripPrefix.
//
// The handler holds a database connection for its whole run. On SQLite it
// also holds the one write lock: other writers, the claims of other keys
// included, wait for it (under postboxsqlite's busy timeout). Keep such
// handlers short.
//
// Responses are buffered: Flush, Hijack and informational (1xx) responses
// are not available to the handler (http.ResponseController reports
// http.ErrNotSupported).
//
// # Clean-up
//
// Records expire Config.TTL after completion. Cleanup deletes expired ones
// in batches of Config.CleanupBatch; Start runs it every
// Config.CleanupInterval in one goroutine until Stop.
package postboxidem
