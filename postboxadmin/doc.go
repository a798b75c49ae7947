// Package postboxadmin is the admin HTTP API of postbox: the outbox's
// status, its dead messages, replay and pruning, and the consumers' dead
// letters, over the same operations as the postbox CLI (postbox.Admin and
// postbox.Inbox). It uses net/http only.
//
//	srv, err := postboxadmin.New(&postboxadmin.Config{
//		Admin:        admin, // *postbox.Admin
//		ConsumerDead: inbox, // optional: a *postbox.Inbox[TTx]
//		Tokens: []postboxadmin.Token{
//			{Name: "ops-oncall", Value: os.Getenv("POSTBOX_ADMIN_TOKEN"), Scope: postboxadmin.ScopeAdmin},
//			{Name: "grafana", Value: os.Getenv("POSTBOX_READ_TOKEN"), Scope: postboxadmin.ScopeRead},
//		},
//	})
//	if err != nil { ... } // a *postbox.ConfigError naming every bad field
//	err = srv.ListenAndServe(ctx, ":8081") // until ctx ends, then a graceful shutdown
//
// Or mount srv.Handler() in a server of your own.
//
// # Authentication
//
// Requests carry "Authorization: Bearer <token>". A token has the read
// scope or the admin scope, which implies read. The presented token is
// compared with every configured one in constant time (SHA-256 digests, so
// neither its length nor which token matched shows in the timing). A
// missing, malformed or unknown token gets 401 with WWW-Authenticate:
// Bearer; a read token on an admin endpoint gets 403. The token's Name is
// the actor of the replay audit and of the server's log line for every
// change.
//
// With no token configured, every request is admin and its actor is
// "anonymous@loopback". That mode is for a workstation: ListenAndServe,
// Serve and CheckListen refuse any address but loopback (127.0.0.0/8, ::1,
// localhost; ":8080" means every interface and is refused, as is any other
// name) with a *ListenError, and the handler itself answers 403 unless the
// client's address is loopback and the Host header names a loopback host,
// which also defeats DNS rebinding. State-changing requests from a browser
// page of another origin are refused with 403 in both modes
// (http.CrossOriginProtection).
//
// # Endpoints
//
// The OpenAPI 3.1 document of the API (OpenAPI, and GET /v1/openapi.json)
// describes every endpoint below, its parameters, bodies, answers and
// errors, for generating a client; the package's tests hold it to the
// handlers, status by status and field by field.
//
// Bodies and responses are JSON objects with snake_case fields; times are
// RFC 3339 in UTC. Where a time is accepted (since, until), it is RFC 3339
// or a duration ago, as the CLI takes it: "90m", "2h", "7d".
//
//	method  path                                scope   success
//	------  ----------------------------------  ------  ---------------------------------------------
//	GET     /v1/status                          read    200 the status, overall and per topic
//	GET     /v1/dead                            read    200 {"messages": [...]}, newest first
//	GET     /v1/dead/{id}                       read    200 one dead message
//	POST    /v1/dead/requeue                    admin   200 {"count": n}
//	POST    /v1/dead/delete                     admin   200 {"count": n}
//	POST    /v1/replay                          admin   200 {"count", "dry_run", "as_new", "since", "until",
//	                                                        "topic", "key", "actor", "dropped", "topics", "notes"}
//	GET     /v1/replays                         read    200 {"replays": [...]}, newest first
//	POST    /v1/prune                           admin   200 {"deleted": n}
//	GET     /v1/consumers/dead                  read    200 {"dead_letters": [...]}, newest first
//	POST    /v1/consumers/dead/requeue          admin   202 {"count": n}: requeue requested
//	POST    /v1/consumers/dead/delete           admin   200 {"count": n}
//	GET     /v1/consumers/{consumer}/dead/{id}  read    200 one dead message
//	DELETE  /v1/consumers/{consumer}/dead/{id}  admin   200 {"count": 1}
//	GET     /v1/openapi.json                    none    200 the OpenAPI 3.1 document of this API
//	GET     /healthz                            none    200 {"status": "ok"}
//	GET     /readyz                             none    200 {"status": "ready"}, or 503
//	                                                        {"status": "unavailable", "error": "..."}
//	GET     /metrics                            none*   Config.Metrics' answer
//
// (*) read with Config.MetricsRequireToken; 404 when Config.Metrics is nil.
// GET endpoints answer HEAD too.
//
// Query parameters and bodies:
//
//	GET  /v1/dead              ?topic= &key= &since= &until= &limit= (1..10000, default 100)
//	POST /v1/dead/requeue      {"ids": [...], "topic": "", "key": "", "since": "", "until": "", "all": false}
//	POST /v1/dead/delete       the same
//	POST /v1/replay            {"since": "", "until": "", "topic": "", "key": "", "dry_run": false,
//	                            "as_new": false, "accept_dropped": false}
//	GET  /v1/replays           ?limit= (1..10000, default 50)
//	POST /v1/prune             an empty body, or {}
//	GET  /v1/consumers/dead    ?consumer= &topic= &key= &since= &until= &limit= (1..10000, default 100)
//	POST /v1/consumers/dead/requeue  {"consumer": "", "ids": [...], "topic": "", "key": "", "since": "", "until": "", "all": false}
//	POST /v1/consumers/dead/delete   the same
//
// Every field and parameter may be left out (null counts as left out), but
// for replay's "since". The other endpoints take no parameters.
//
// Status: {"pending", "dead", "published_kept", "pending_estimated",
// "published_kept_estimated", "oldest_pending_age_seconds",
// "unrouted_pending", "held_snapshot", "partitions": {"total", "unowned",
// "relays"}, "topics": [{"topic", "pending", "dead",
// "oldest_pending_age_seconds", "published_last_minute", "routed"}]}.
// "routed" is false for a topic no route of the relay takes
// (Config.Routed); "unrouted_pending" counts those topics' pending
// messages, which are also in "pending". "pending_estimated" and
// "published_kept_estimated" say the count before them is the database's
// estimate (past 10,000 rows, on PostgreSQL; postboxdriver.Stats), which
// the overview shows as "≈ n". "partitions" counts the
// partitions no relay holds a live lease on (all of them while no relay
// runs) and the live relays.
//
// A dead message: {"seq", "id", "topic", "key", "payload", "payload_text",
// "headers", "attempts", "last_error", "created_at", "dead_at"}. A
// consumer's dead message: {"consumer", "message_id", "topic", "key",
// "payload", "payload_text", "headers", "error", "attempts",
// "first_failure_at", "last_failure_at", "dead_at"}. "payload" is always
// there, as base64 (lossless for any bytes); "payload_text" is there too
// when the payload is valid UTF-8, as that text. "headers" is an object of
// strings; a stored value that is not one is shown as "headers_raw".
//
// Requeue and delete select dead messages by "ids" (canonical lower-case
// UUIDs) and the filters (dead at in [since, until)), which narrow each
// other; with none of them, "all": true must be set, as the CLI's --all.
// The consumers' requeue and delete select the same way, with "consumer"
// too, which "ids" need (a message id is unique per consumer only). A
// consumer's handler lives in the consuming service, so a requeue is a
// request (202): the service's started Inbox, which has a Processor for
// the consumer, runs the handler through the inbox within its
// RequeueInterval and removes the dead message; a handler that fails
// again leaves it dead with the new error.
//
// Replay re-stages published messages created in [since, until) ("since"
// is required, "until" defaults to now), narrowed by topic and key, under
// their own ids; every replay, dry runs included, is recorded with the
// actor (GET /v1/replays). Under their own ids, a broker with a duplicate
// window (Config.DedupeWindow: JetStream's Duplicates, the Redis
// publisher's dedupe key) drops the copies of messages it saw within it:
// the answer counts them ("dropped", and per topic in "topics": "count",
// "dedupe_window_seconds", "dedupe_by", "dropped") and says so in
// "notes", and a real replay is refused with 409 while any would be
// dropped, unless "accept_dropped" is set. With "as_new" the messages are
// sent as new ones instead: fresh ids, every header kept, plus
// "postbox-replay-of" (the original id) and "postbox-replay" (the audit
// entry's id), so every consumer runs them again; the history keeps the
// originals and no retention horizon applies. Prune deletes published messages older than
// the Admin's retention in bounded batches until none is left; it never
// touches pending or dead ones, and the relay prunes on its own, so this is
// for a one-off.
//
// # Errors
//
// Every error is a JSON object {"error": "...", "field": "..."}, with
// field when one is at fault: the body's field ("ids[2]", "since"), the
// query parameter ("limit") or the path segment ("id", "consumer").
//
//	status  when
//	------  -------------------------------------------------------------------------------------------
//	400     malformed JSON, a body that is not an object, data after it, an unknown field (names match
//	        exactly), a field of the wrong type, a repeated field, an unknown or repeated query parameter, a bad time,
//	        limit outside 1..10000, an invalid id, topic, key or consumer, since not before until, a
//	        replay without since, a requeue or delete that selects nothing and does not set "all"
//	401     no token, a malformed Authorization header, an unknown token (with WWW-Authenticate)
//	403     a read token on an admin endpoint; with no tokens, a non-loopback client or Host; a
//	        cross-origin browser request that changes something
//	404     no such dead message; no such endpoint; /metrics without Config.Metrics
//	405     a method the path does not serve (with Allow)
//	413     a body over Config.MaxBodyBytes (1 MiB)
//	409     a replay under the messages' own ids that the broker would partly drop as copies (field
//	        "as_new"): set "as_new" or "accept_dropped"
//	422     a replay whose since is before the retention horizon (field "since"): the request is
//	        well formed, but honouring it could run consumers' handlers twice once their inboxes
//	        have forgotten the ids
//	500     a store failure: {"error": "internal error; ...", "request_id"}; the detail (never sent:
//	        it may name hosts or SQL) is logged with the request id
//	501     a consumer endpoint when Config.ConsumerDead is nil
//	503     the tables are not migrated; /readyz failing
//
// # Dashboard
//
// The server also serves an HTML dashboard, for working from a browser
// (screenshots in docs/dashboard.md). It is embedded: server-rendered
// pages, one style sheet and one small script under /static/, nothing
// from anywhere else (Content-Security-Policy: 'self' only). Every page
// reads and works without JavaScript; the script only keeps the overview
// current.
//
//	path                      scope  what
//	------------------------  -----  ------------------------------------------------------
//	/                         read   overview: pending, oldest pending age, unrouted, dead,
//	                                 charts over time, topics (routed or not), the relays with
//	                                 the partitions each holds and their lease expiry, shards
//	/dead                     read   the outbox's dead messages: filter (topic, key, dead since,
//	                                 dead before), tick, open one (/dead/show?id=)
//	/dead/confirm             admin  what a requeue or delete will do, with the count
//	/consumers                read   consumers' dead messages: the same, by consumer too
//	/replay                   read   the replay form; a dry run (admin) comes before the replay
//	/replays                  read   the replay audit
//	/signin, /signout                a token for a session, and back
//
// Sign-in. With tokens configured, a page opened without a session goes
// to /signin, where one posts one of the API's tokens. A good one starts
// a session held in memory (Sessions; one per server unless
// Config.Sessions shares one, as the relay daemon does across its
// databases) and sets the cookie postbox_session: a random 256-bit id,
// HttpOnly, SameSite=Strict, Path=/, Secure on a request over TLS or with
// Config.SecureCookies (for a proxy that terminates TLS), expiring with
// the session after DefaultSessionLifetime (8 h; NewSessions sets
// another). Sign-out ends the session on the server. A restart ends every
// session. A session has the token's name (the actor of its changes) and
// scope: a read token's session sees every page and is shown no action;
// a request for one answers 403 saying that the scope can see but not
// act.
//
// Actions. Every change goes: a GET confirmation page that states the
// count of messages it will change (and fixes relative times such as "2h"
// into the times they mean), then a POST carrying the session's CSRF token
// (the hidden field csrf_token, or the X-CSRF-Token header), compared in
// constant time; a POST without it, with another session's, or from a
// page of another origin (http.CrossOriginProtection) changes nothing and
// answers 403. The pages call the functions the API's handlers call:
// requeue and delete of the outbox's dead messages (Admin), requeue
// requests and deletes of the consumers' (ConsumerDead: the consuming
// service's running Inbox carries a requeue out), and replay (a dry run
// first, with the brokers' duplicate windows, then under the original ids
// or as new messages).
//
// The session also reads the API's GET endpoints (the overview's script
// reads GET /v1/status every 5 seconds); it never authorizes a change
// through the API, which stays bearer-token only.
//
// Without tokens (loopback only), there is no sign-in: the first page
// gives the browser an anonymous session, as the carrier of its CSRF
// token.
//
// Charts. The overview draws pending, oldest pending age, publish rate and
// commit-to-ack lag (the longest in the last minute) as inline SVG from
// samples the server keeps: one per status read (the dashboard's, its
// script's, or any GET /v1/status), at most one per 2 seconds, the last
// 180. Nothing samples when no one looks.
package postboxadmin
