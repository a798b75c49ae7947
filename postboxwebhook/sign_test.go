package postboxwebhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// The test vector of the Standard Webhooks reference libraries
// (libraries/go/webhook_test.go, TestWebhookSign).
const (
	katSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	katID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	katTimestamp = 1614265330
	katBody      = `{"test": 2432232314}`
	katSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func katHeader() http.Header {
	h := http.Header{}
	h.Set(postboxwebhook.HeaderWebhookID, katID)
	h.Set(postboxwebhook.HeaderWebhookTimestamp, strconv.Itoa(katTimestamp))
	h.Set(postboxwebhook.HeaderWebhookSignature, katSignature)
	return h
}

func katVerifier(t *testing.T, secrets ...string) *postboxwebhook.Verifier {
	t.Helper()
	v, err := postboxwebhook.NewVerifier(secrets...)
	if err != nil {
		t.Fatal(err)
	}
	return postboxwebhook.WithClock(v, func() time.Time { return time.Unix(katTimestamp+30, 0) })
}

func TestSignKnownAnswer(t *testing.T) {
	s, err := postboxwebhook.NewSigner(katSecret)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sign(katID, time.Unix(katTimestamp, 0), []byte(katBody)); got != katSignature {
		t.Fatalf("signature %s, want %s", got, katSignature)
	}
	if err := katVerifier(t, katSecret).Verify(katHeader(), []byte(katBody)); err != nil {
		t.Fatalf("the reference vector does not verify: %v", err)
	}
}

// The signed content, computed here from the specification's text alone:
// base64(HMAC-SHA256(base64-decoded key, "{id}.{timestamp}.{body}")).
func TestSignMatchesTheSpecifiedContent(t *testing.T) {
	secret := newSecret(t)
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	id, ts, body := postbox.NewID(), time.Now(), []byte("any body\x00\xff with.dots.")
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s.%d.%s", id, ts.Unix(), body)
	want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	s, err := postboxwebhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sign(id, ts, body); got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
}

// Rotation: the sender signs with the new and the old secret; a receiver
// holding either verifies, one holding neither does not.
func TestRotation(t *testing.T) {
	oldS, newS, other := newSecret(t), newSecret(t), newSecret(t)
	s, err := postboxwebhook.NewSigner(newS, oldS)
	if err != nil {
		t.Fatal(err)
	}
	id, now, body := postbox.NewID(), time.Now(), []byte(`{"n":1}`)
	sig := s.Sign(id, now, body)
	if n := len(strings.Fields(sig)); n != 2 {
		t.Fatalf("signature header %q has %d entries, want 2", sig, n)
	}
	h := http.Header{}
	h.Set(postboxwebhook.HeaderWebhookID, id)
	h.Set(postboxwebhook.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(postboxwebhook.HeaderWebhookSignature, sig)
	for _, secrets := range [][]string{{oldS}, {newS}, {other, oldS}, {newS, other}} {
		v, err := postboxwebhook.NewVerifier(secrets...)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Verify(h, body); err != nil {
			t.Fatalf("verifier with %d secrets: %v", len(secrets), err)
		}
	}
	v, err := postboxwebhook.NewVerifier(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(h, body); !errors.Is(err, postboxwebhook.ErrBadSignature) {
		t.Fatalf("verifier with an unrelated secret: %v, want ErrBadSignature", err)
	}
}

func TestVerifyRejects(t *testing.T) {
	body := []byte(katBody)
	cases := []struct {
		name string
		mod  func(h http.Header, body []byte) []byte
		want error
	}{
		{"tampered body", func(_ http.Header, b []byte) []byte { return append(b, ' ') }, postboxwebhook.ErrBadSignature},
		{"truncated body", func(_ http.Header, b []byte) []byte { return b[:len(b)-1] }, postboxwebhook.ErrBadSignature},
		{"tampered id", func(h http.Header, b []byte) []byte { h.Set("webhook-id", katID+"x"); return b }, postboxwebhook.ErrBadSignature},
		{"tampered timestamp", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", strconv.Itoa(katTimestamp+1))
			return b
		}, postboxwebhook.ErrBadSignature},
		{"tampered signature", func(h http.Header, b []byte) []byte {
			h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=")
			return b
		}, postboxwebhook.ErrBadSignature},
		{"other version", func(h http.Header, b []byte) []byte {
			h.Set("webhook-signature", strings.Replace(katSignature, "v1,", "v2,", 1))
			return b
		}, postboxwebhook.ErrBadSignature},
		{"asymmetric entry only", func(h http.Header, b []byte) []byte {
			h.Set("webhook-signature", "v1a,"+strings.TrimPrefix(katSignature, "v1,"))
			return b
		}, postboxwebhook.ErrBadSignature},
		{"no version", func(h http.Header, b []byte) []byte {
			h.Set("webhook-signature", strings.TrimPrefix(katSignature, "v1,"))
			return b
		}, postboxwebhook.ErrBadSignature},
		{"missing id", func(h http.Header, b []byte) []byte { h.Del("webhook-id"); return b }, postboxwebhook.ErrMissingHeaders},
		{"missing timestamp", func(h http.Header, b []byte) []byte { h.Del("webhook-timestamp"); return b }, postboxwebhook.ErrMissingHeaders},
		{"missing signature", func(h http.Header, b []byte) []byte { h.Del("webhook-signature"); return b }, postboxwebhook.ErrMissingHeaders},
		{"empty signature", func(h http.Header, b []byte) []byte { h.Set("webhook-signature", ""); return b }, postboxwebhook.ErrMissingHeaders},
		{"signed, then a leading zero", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", "0"+strconv.Itoa(katTimestamp))
			return b
		}, postboxwebhook.ErrInvalidHeaders},
		{"signed timestamp", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", "+"+strconv.Itoa(katTimestamp))
			return b
		}, postboxwebhook.ErrInvalidHeaders},
		{"timestamp in milliseconds", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", strconv.Itoa(katTimestamp)+"000")
			return b
		}, postboxwebhook.ErrInvalidHeaders},
		{"timestamp a day late", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", strconv.Itoa(katTimestamp+86400))
			return b
		}, postboxwebhook.ErrTimestamp},
		{"non-numeric timestamp", func(h http.Header, b []byte) []byte {
			h.Set("webhook-timestamp", "2021-02-25T15:02:10Z")
			return b
		}, postboxwebhook.ErrInvalidHeaders},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := katHeader()
			b := c.mod(h, append([]byte(nil), body...))
			err := katVerifier(t, katSecret).Verify(h, b)
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify: %v, want %v", err, c.want)
			}
		})
	}
}

func TestVerifyTimestampTolerance(t *testing.T) {
	secret := newSecret(t)
	s, err := postboxwebhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	v, err := postboxwebhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	if v.Tolerance() != postboxwebhook.DefaultTolerance {
		t.Fatalf("default tolerance %s, want %s", v.Tolerance(), postboxwebhook.DefaultTolerance)
	}
	now := time.Unix(1_800_000_000, 0)
	v = postboxwebhook.WithClock(v, func() time.Time { return now })
	body := []byte("x")
	signed := func(at time.Time) http.Header {
		h := http.Header{}
		h.Set("webhook-id", "msg_1")
		h.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
		h.Set("webhook-signature", s.Sign("msg_1", at, body))
		return h
	}
	for _, c := range []struct {
		at time.Time
		ok bool
	}{
		{now, true},
		{now.Add(-5 * time.Minute), true},
		{now.Add(5 * time.Minute), true},
		{now.Add(-5*time.Minute - time.Second), false},
		{now.Add(5*time.Minute + time.Second), false},
		{now.Add(-24 * time.Hour), false},
		{time.Unix(0, 0), false},
	} {
		err := v.Verify(signed(c.at), body)
		if c.ok && err != nil || !c.ok && !errors.Is(err, postboxwebhook.ErrTimestamp) {
			t.Fatalf("timestamp %s from now: %v", c.at.Sub(now), err)
		}
	}
	wide, err := v.WithTolerance(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := wide.Verify(signed(now.Add(-59*time.Minute)), body); err != nil {
		t.Fatalf("an hour's tolerance refused a timestamp 59m old: %v", err)
	}
	if err := v.Verify(signed(now.Add(-59*time.Minute)), body); !errors.Is(err, postboxwebhook.ErrTimestamp) {
		t.Fatalf("WithTolerance changed the original verifier: %v", err)
	}
	for _, d := range []time.Duration{0, -time.Second, time.Millisecond, 25 * time.Hour} {
		var ce *postbox.ConfigError
		if _, err := v.WithTolerance(d); !errors.As(err, &ce) {
			t.Fatalf("WithTolerance(%s): %v, want a *postbox.ConfigError", d, err)
		}
	}
}

// Secrets are checked, and the errors name them by position only.
func TestSecretValidation(t *testing.T) {
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("only sixteen byt"))
	noPrefix := strings.TrimPrefix(katSecret, "whsec_")
	badB64 := "whsec_not*base64*at*all*but*long*enough"
	_, err := postboxwebhook.NewVerifier(katSecret, short, noPrefix, badB64)
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("NewVerifier: %v, want a *postbox.ConfigError", err)
	}
	if len(ce.Problems) != 3 {
		t.Fatalf("%d problems, want 3: %v", len(ce.Problems), err)
	}
	for i, p := range ce.Problems {
		if want := fmt.Sprintf("secrets[%d]", i+1); p.Field != want {
			t.Fatalf("problem %d names %q, want %q", i, p.Field, want)
		}
	}
	for _, s := range []string{short, noPrefix, badB64, "MfKQ9r8GKYqrTwjUPD8"} {
		if strings.Contains(err.Error(), strings.TrimPrefix(s, "whsec_")[:12]) {
			t.Fatalf("error quotes a secret: %v", err)
		}
	}
	if _, err := postboxwebhook.NewVerifier(); !errors.As(err, &ce) {
		t.Fatalf("NewVerifier without secrets: %v, want a *postbox.ConfigError", err)
	}
	if _, err := postboxwebhook.NewSigner(short); !errors.As(err, &ce) {
		t.Fatalf("NewSigner with a short secret: %v, want a *postbox.ConfigError", err)
	}
}

// A Secret never prints, by fmt or by slog.
func TestSecretRedacted(t *testing.T) {
	s := postboxwebhook.Secret(katSecret)
	var b strings.Builder
	fmt.Fprintf(&b, "%v %s %+v %#v %q", s, s, s, s, s)
	cfg := one("https://user:pw@example.com/hook?token=tok", katSecret)
	cfg.Destinations[0].Headers = map[string]string{"Authorization": "Bearer hunter2"}
	fmt.Fprintf(&b, " %v %+v %#v %v %s", cfg, *cfg, cfg, cfg.Destinations, cfg.Destinations[0])
	slog.New(slog.NewTextHandler(&b, nil)).Info("config", "secret", s, "dest", cfg.Destinations[0])
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "secret", s, "dest", cfg.Destinations[0], "cfg", cfg)
	out := b.String()
	for _, leak := range []string{"MfKQ9r8GKYqrTwjUPD8", "hunter2", "token=tok", "pw@"} {
		if strings.Contains(out, leak) {
			t.Fatalf("printed %q: %s", leak, out)
		}
	}
	if !strings.Contains(out, "whsec_(redacted)") {
		t.Fatalf("no redaction marker in %s", out)
	}
}
