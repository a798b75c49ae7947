package postboxnats_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxnats"
)

func TestValidateSubject(t *testing.T) {
	for _, s := range []string{"a", "orders.created", "events.billing:invoice-paid_v2", "a.b.c.d.e", "ünïcode.ok", "$KV.bucket.key", "a*b.c>d"} {
		if err := postboxnats.ValidateSubject(s); err != nil {
			t.Errorf("ValidateSubject(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range []string{"", ".a", "a.", "a..b", "*", "a.*", "a.>", ">", "a b", "a\tb", "a\r\nb", "a\x00b", "a\x7fb",
		"$JS.API.STREAM.DELETE.X", "$SYS.REQ.SERVER.PING", "$JSC.R.x", "$NRG.x", "\xff\xfe", strings.Repeat("a", postboxnats.MaxSubjectBytes+1)} {
		err := postboxnats.ValidateSubject(s)
		if !errors.Is(err, postboxnats.ErrInvalidSubject) {
			t.Errorf("ValidateSubject(%q) = %v, want ErrInvalidSubject", s, err)
		}
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	c := (*postboxnats.Config)(nil).WithDefaults()
	if c.PublishTimeout != postboxnats.DefaultPublishTimeout || c.MaxPending != postboxnats.DefaultMaxPending {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if postboxnats.DefaultPublishTimeout >= postbox.DefaultBatchDeadline {
		t.Fatalf("default publish timeout %s not under the relay's batch deadline %s", postboxnats.DefaultPublishTimeout, postbox.DefaultBatchDeadline)
	}
	for _, tc := range []struct {
		cfg   postboxnats.Config
		field string
	}{
		{postboxnats.Config{SubjectPrefix: "events"}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "a..b."}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "ev ents."}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "events.", Subject: func(s string) string { return s }}, "SubjectPrefix"},
		{postboxnats.Config{ExpectStream: "a b"}, "ExpectStream"},
		{postboxnats.Config{ExpectStream: "a\x01"}, "ExpectStream"},
		{postboxnats.Config{PublishTimeout: -1}, "PublishTimeout"},
		{postboxnats.Config{PublishTimeout: 24 * 60 * 60 * 1e9}, "PublishTimeout"},
		{postboxnats.Config{MaxPending: -5}, "MaxPending"},
		{postboxnats.Config{MaxPending: 1 << 30}, "MaxPending"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		var ce *postbox.ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != tc.field {
			t.Errorf("%+v: got %v, want one problem in %s", tc.cfg, err, tc.field)
		}
	}
	ok := postboxnats.Config{SubjectPrefix: "events.", ExpectStream: "EVENTS"}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
