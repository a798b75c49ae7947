package postboxschema_test

import (
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxschema"
)

// FuzzValidatePayload: any payload, on each topic of the test schemas, gives
// nil or a *postbox.ValidationError, the same one each time, and never a
// panic.
func FuzzValidatePayload(f *testing.F) {
	topics := []string{"orders.created", "payments.refunded", "users.signed_up", "no.schema"}
	for _, p := range []string{
		`{"id":"ord_1","amount":12.5,"currency":"EUR","items":[{"sku":"a","qty":2}]}`,
		`{"order":"o","amount":1,"reason":{"code":"x"},"note":5}`,
		`{"email":"a@b"}`,
		`{"amount":1e400,"id":"ord_1","currency":"EUR"}`,
		`[[[[[]]]]]`,
	} {
		for which := range len(topics) {
			f.Add(uint8(which), []byte(p))
		}
	}
	reg, err := postboxschema.Load("testdata/schemas", nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, payload []byte) {
		topic := topics[int(which)%len(topics)]
		err := reg.ValidatePayload(topic, payload)
		if err == nil {
			return
		}
		ve, ok := err.(*postbox.ValidationError) //nolint:errorlint // the exact type is the contract
		if !ok || ve.Field != "payload" || ve.Reason == "" {
			t.Fatalf("got %#v", err)
		}
		if again := reg.ValidatePayload(topic, payload); again.Error() != err.Error() {
			t.Fatalf("two reasons for one payload:\n%v\n%v", err, again)
		}
	})
}
