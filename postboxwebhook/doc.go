// Package postboxwebhook delivers postbox messages as HTTP webhooks signed
// the Standard Webhooks way, and receives them into an inbox.
//
// The sending side is a Publisher, the relay's postbox.Publisher for HTTP:
// each envelope becomes one POST to the destination its topic routes to,
// and counts as published only once the receiver answers 2xx (guarantee
// G3 of docs/design.md). The receiving side is a Verifier, which checks a
// request's signature, and a Receiver, an http.Handler that verifies each request
// and hands the message to a postbox.Processor, usually an Inbox's, so
// that a webhook takes effect exactly once however often it is sent.
//
//	pub, err := postboxwebhook.New(&postboxwebhook.Config{
//		Destinations: []postboxwebhook.Destination{{
//			Topics:  "orders.*",
//			URL:     "https://billing.example.com/webhooks/orders",
//			Secrets: []postboxwebhook.Secret{postboxwebhook.Secret(os.Getenv("BILLING_WEBHOOK_SECRET"))},
//		}},
//	})
//	defer pub.Close(ctx)
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{
//		Routes: []postbox.Route{{Topics: "orders.*", Publisher: pub}},
//	})
//
// and on the receiving service:
//
//	v, err := postboxwebhook.NewVerifier(os.Getenv("BILLING_WEBHOOK_SECRET"))
//	client, err := postbox.NewClient(postboxpgx.New(pool), nil)
//	inbox := client.Inbox()
//	rc, err := postboxwebhook.NewReceiver(v, inbox.Processor("billing", handle), nil)
//	http.Handle("POST /webhooks/orders", rc)
//
// # The request on the wire
//
// A message becomes a POST to its destination's URL, with the payload,
// unchanged, as the body, and these headers:
//
//	header                 value
//	webhook-id             the message id: the same on every retry (G7), so a
//	                       receiver drops copies by it
//	webhook-timestamp      when this attempt was sent, in Unix seconds
//	webhook-signature      "v1,<base64 HMAC-SHA256>", one per secret, space-separated
//	Content-Type           the message's content type; application/octet-stream
//	                       when it has none (the payload is opaque bytes to postbox)
//	ce-specversion, ce-id, CloudEvents attributes in HTTP binary mode: the id, the
//	ce-type, ce-source,    topic as ce-type, the key as ce-partitionkey; values
//	ce-time, ce-subject,   percent-encoded as the CloudEvents HTTP binding requires
//	ce-partitionkey        (space, '"', '%' and every byte outside printable ASCII)
//	the message's headers  as they are (traceparent, tenant, ...)
//	Destination.Headers    static headers of the destination, e.g. Authorization;
//	                       they replace a message header of the same name
//	Idempotency-Key        the message id again; it also lets Go's client resend the
//	                       request on a fresh connection when a pooled one was closed
//	User-Agent             postboxwebhook
//
// A message whose headers cannot travel in HTTP (control characters, a
// name that is not an HTTP token), or that names a header the Publisher or
// the HTTP client sets (webhook-*, Idempotency-Key, Host, Content-Length,
// Connection, Transfer-Encoding, ...), fails as a message failure wrapping
// ErrInvalidHeader; an id that is empty, over 255 bytes, or holds a space,
// a control or non-ASCII byte or a "." fails with ErrInvalidID. Both are
// permanent, and the Publisher, a postbox.MessageChecker, refuses them at
// write time already. HTTP
// header names are case-insensitive: receivers see them in whatever case
// their server gives, and the Receiver lower-cases them.
//
// # The signature
//
// A secret is "whsec_" followed by the standard base64 (with padding) of
// 24 to 512 random bytes; give each destination a secret of its own. The
// signature of a request is
//
//	base64(HMAC-SHA256(key, webhook-id + "." + webhook-timestamp + "." + body))
//
// where key is the secret's decoded bytes, webhook-timestamp is the
// header's decimal text, and body is the raw request body, byte for byte
// (parsing and re-serializing JSON breaks it). webhook-signature carries
// "v1," followed by that signature, once for each of the destination's
// secrets, separated by spaces: to rotate a secret, list the new one and
// the old one, move every receiver to the new one, then drop the old.
//
// Only webhook-id, webhook-timestamp and the body are signed. The other
// headers (ce-type, ce-partitionkey, the message's headers) are not:
// use https URLs, so that nothing between the relay and the receiver can
// change them.
//
// To verify in another language, recompute the signature for each secret
// you hold, compare it in constant time with every "v1," entry of
// webhook-signature, and refuse a webhook-timestamp more than a few
// minutes from your clock. In Python:
//
//	import base64, hashlib, hmac, time
//
//	def verify(secret: str, headers, body: bytes) -> None:
//	    key = base64.b64decode(secret.removeprefix("whsec_"))
//	    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
//	    if abs(time.time() - int(ts)) > 300:
//	        raise ValueError("timestamp outside the tolerance")
//	    signed = f"{msg_id}.{ts}.".encode() + body
//	    want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
//	    for entry in headers["webhook-signature"].split():
//	        version, _, sig = entry.partition(",")
//	        if version == "v1" and hmac.compare_digest(sig, want):
//	            return
//	    raise ValueError("no matching signature")
//
// The Standard Webhooks libraries (standardwebhooks on PyPI and npm, and
// others) do the same and accept these requests.
//
// # Failures
//
// done gets nil on a 2xx and otherwise an error the relay sorts by
// postbox.IsPermanent and postbox.IsMessageError (see ClassifyStatus, and
// docs/design.md §4); the Publisher wraps the answers that say no retry
// can succeed with postbox.Permanent (the relay buries the message at
// once), and every other message failure with postbox.NewMessageError:
//
//	outcome                                    class           error
//	200-299                                    success         nil
//	300-399 (redirects are never followed)     message         *StatusError, ErrRedirect
//	410 Gone, 413 Content Too Large,           permanent       *StatusError, ErrRejected
//	  431 Request Header Fields Too Large
//	400-499 except 408, 429 and the above      message         *StatusError, ErrRejected
//	408, 429                                   infrastructure  *StatusError, ErrUnavailable
//	500-599, and any other status              infrastructure  *StatusError, ErrUnavailable
//	no answer within Destination.Timeout       infrastructure  context.DeadlineExceeded
//	connection refused or reset, DNS, TLS      infrastructure  the client's error
//	the publish's context ended                infrastructure  ctx.Err()
//	Publisher closed                           infrastructure  ErrClosed
//	no destination matches the topic           message         ErrNoDestination
//	a header or id that cannot be sent         permanent       ErrInvalidHeader, ErrInvalidID
//
// A message failure spends one of the message's attempts and backs it off;
// after postbox.Config.MaxAttempts it moves to the dead table, where it
// stays visible and can be requeued. An infrastructure failure spends
// nothing: the message stays pending and the relay pauses, then sends it
// again under the same webhook-id.
//
// A 4xx says this request will not be accepted as it is. A 404 or 401
// from a misconfigured destination fails every message sent there until
// the configuration is fixed; they end in the dead table and can be
// requeued then. A 410 Gone says the receiver retired the endpoint, and a
// 413 or 431 that this message is too large for it: no retry can help, so
// the message is dead on that first answer, to be requeued once the
// destination is changed. A 3xx is a message failure for the same reason:
// Standard Webhooks asks senders not to follow redirects, a moved receiver
// is fixed by updating the URL, and following one would send the signed
// body to a host nobody configured. The Publisher hands its client a copy
// that never follows them.
//
// A Retry-After header on a 429 or 503 is kept in StatusError.RetryAfter
// for the logs; the relay paces its retries by its own pause, which grows
// from 50ms to 10s while failures go on.
//
// # Timeouts
//
// Destination.Timeout (5s by default) bounds each request, from dialing
// to the response's status and its drained body. Keep it under the
// relay's BatchDeadline (postbox.Config, 10s by default, itself under the
// LeaseDuration of 30s): at the deadline the relay gives up on the batch
// and cancels its open requests. A receiver that needs longer than a few
// seconds needs a longer BatchDeadline and LeaseDuration too. A response
// body is read only to reuse the connection, up to 64 KiB, and its first
// 256 bytes are quoted in a StatusError.
//
// # Concurrency
//
// Each publish runs its request on a goroutine of its own. A
// destination's MaxInFlight (64 by default) bounds the requests open to
// it, and Publish blocks while they are all busy. The default client keeps that
// many idle connections per host, caps response headers at 64 KiB, and
// otherwise has http.DefaultTransport's settings (proxy from the
// environment, 30s dial timeout, 10s TLS handshake timeout). Close waits
// for the open requests, cancels them when its context ends, and closes
// the idle connections.
//
// # The Receiver
//
// A Receiver answers:
//
//	status  when
//	204     the Processor's verdict is Ack (a first run committed, or a copy) or
//	        DeadLettered (the consumer's budget is spent and its dead message kept)
//	503     the verdict is Retry, with Retry-After: the verdict's delay in
//	        seconds, rounded up, at least 1
//	500     the Processor returned an unknown action
//	401     the signature matches none of the secrets, or the timestamp is
//	        outside the tolerance (ErrBadSignature, ErrTimestamp)
//	400     a webhook-* header is missing or malformed (ErrMissingHeaders,
//	        ErrInvalidHeaders), webhook-id is not 1 to 255 bytes of printable
//	        ASCII, or a ce-* header is not valid percent-encoded UTF-8
//	413     the body is over ReceiverConfig.MaxBodyBytes (1 MiB by default)
//	405     the method is not POST
//
// so a sending Publisher counts a refused request (400, 401, 413) as a
// message failure and a Retry (503) as an infrastructure failure: a
// consumer whose handler fails makes the relay send the message again,
// spending the consumer's attempts (the inbox's MaxAttempts) but not the
// outbox's, until the handler succeeds or the inbox dead-letters the
// message and answers 204. While that goes on, the relay's lane that
// carries the message keeps pausing between tries; the inbox's budget
// bounds it.
//
// The Delivery it hands over has ID = webhook-id, Topic = ce-type, Key =
// ce-partitionkey, Payload = the body, Delivered = 0 (HTTP keeps no
// delivery count), and Headers = the request's headers with lower-case
// names, values of repeated headers joined by ", ", ce-* values
// percent-decoded, and these left out: the webhook-* headers,
// Idempotency-Key, the connection's own (Host, Content-Length,
// Transfer-Encoding, Connection, Keep-Alive, TE, Trailer, Upgrade,
// Expect, User-Agent, Accept-Encoding), the credentials (Authorization,
// Proxy-Authorization, Cookie), the proxies' (Forwarded, Via,
// X-Forwarded-*, X-Real-IP), and ReceiverConfig.IgnoreHeaders. A message
// without a content type arrives with content-type
// application/octet-stream.
//
// Verification uses the request's own body and headers; the timestamp
// tolerance (DefaultTolerance, 5 minutes, see Verifier.WithTolerance)
// bounds how long a captured request can be replayed, and the inbox drops
// a replay within that window by its webhook-id.
//
// # The broker conformance suite
//
// This package does not run postboxbrokertest. The suite is written for a
// broker that stores messages for subscribers that pull them: it
// publishes first and subscribes afterwards, expects every consumer name
// to receive every message, expects subscribers of one consumer to share
// the messages, and expects the broker to redeliver on a Retry verdict. A
// webhook has no store between the Publisher and the Receiver: a publish
// succeeds only while a receiver answers, a message goes to one URL, and
// a redelivery is the relay's own retry after a 503. Declaring Features
// cannot describe that, so the tests here check the same properties the
// way a webhook has them: the classification of every status class and
// transport failure, a canceled publish as an infrastructure failure, and
// an end-to-end run from PostgreSQL through the relay to a Receiver and
// an Inbox (TestEndToEnd: every message takes effect once, in order per
// key, through an outage and lost answers, with no attempt spent;
// TestEndToEndRejectedGoesDead: a 422 spends the attempts and ends in the
// dead table).
package postboxwebhook
