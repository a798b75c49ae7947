package postboxwebhook

import "time"

// WithClock returns a copy of v that reads the time from now, so a test
// can verify a signature made long ago.
func WithClock(v *Verifier, now func() time.Time) *Verifier {
	c := *v
	c.now = now
	return &c
}

// CEEncode and CEDecode expose the CloudEvents header value codec.
var (
	CEEncode = ceEncode
	CEDecode = ceDecode
)
