package postboxwebhook_test

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxwebhook"
)

// FuzzVerify: arbitrary headers and bodies never panic the Verifier, and
// only correctly signed input verifies. The verifier's clock stands at the
// reference vector's timestamp, so the seed made from that vector takes
// the accepting path too. Seeds: testdata/fuzz/FuzzVerify.
func FuzzVerify(f *testing.F) {
	f.Add(katID, strconv.Itoa(katTimestamp), katSignature, []byte(katBody))
	f.Add("msg_1", "1614265330", "v1,AAAA v1a,BBBB v2", []byte{})
	f.Add("", "", "", []byte(nil))
	signer, err := postboxwebhook.NewSigner(katSecret)
	if err != nil {
		f.Fatal(err)
	}
	v, err := postboxwebhook.NewVerifier(katSecret)
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(katTimestamp, 0)
	v = postboxwebhook.WithClock(v, func() time.Time { return now })

	f.Fuzz(func(t *testing.T, id, ts, sigs string, body []byte) {
		h := http.Header{}
		h.Set(postboxwebhook.HeaderWebhookID, id)
		h.Set(postboxwebhook.HeaderWebhookTimestamp, ts)
		h.Set(postboxwebhook.HeaderWebhookSignature, sigs)
		err := v.Verify(h, body)
		if err == nil {
			// Accepted: the timestamp must be the canonical number
			// within the tolerance, and one entry the signature the
			// secret makes for exactly this content.
			sec, perr := strconv.ParseInt(ts, 10, 64)
			if perr != nil || strconv.FormatInt(sec, 10) != ts {
				t.Fatalf("accepted the non-canonical timestamp %q", ts)
			}
			at := time.Unix(sec, 0)
			if d := at.Sub(now).Abs(); d > postboxwebhook.DefaultTolerance {
				t.Fatalf("accepted a timestamp %s away", d)
			}
			want := signer.Sign(id, at, body)
			found := false
			for _, entry := range strings.Fields(sigs) {
				found = found || entry == want
			}
			if !found {
				t.Fatalf("accepted %q for id %q, ts %q, body %q; the signature is %q", sigs, id, ts, body, want)
			}
		} else if !errors.Is(err, postboxwebhook.ErrMissingHeaders) && !errors.Is(err, postboxwebhook.ErrInvalidHeaders) &&
			!errors.Is(err, postboxwebhook.ErrTimestamp) && !errors.Is(err, postboxwebhook.ErrBadSignature) {
			t.Fatalf("untyped error %v", err)
		}

		// The same id and body, signed now, verify (given an id), with
		// the fuzzed signatures around the real one.
		if id == "" {
			return
		}
		h.Set(postboxwebhook.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
		h.Set(postboxwebhook.HeaderWebhookSignature, sigs+" "+signer.Sign(id, now, body)+" "+sigs)
		if err := v.Verify(h, body); err != nil {
			t.Fatalf("a correct signature among others was refused: %v", err)
		}
		// Any change to the body breaks it.
		h.Set(postboxwebhook.HeaderWebhookSignature, signer.Sign(id, now, body))
		tampered := append(bytes.Clone(body), '!')
		if len(body) > 0 {
			tampered = bytes.Clone(body)
			tampered[len(tampered)/2] ^= 0x20
		}
		if err := v.Verify(h, tampered); !errors.Is(err, postboxwebhook.ErrBadSignature) {
			t.Fatalf("a tampered body: %v, want ErrBadSignature", err)
		}
	})
}
