package postboxdriver

// The states of an idempotency record. A claim is "processing" until the
// handler's transaction commits the response ("succeeded", whatever the
// status) or the claim is released for a retry ("failed").
const (
	IdempotencyProcessing = "processing"
	IdempotencySucceeded  = "succeeded"
	IdempotencyFailed     = "failed"
)

// IdempotencyRecord is a key's record as LookupIdempotency reads it.
type IdempotencyRecord struct {
	State       string
	Fingerprint []byte
	Status      int
	Headers     string // JSON object
	Body        []byte
	TooLarge    bool
	// ClaimLeftMillis is what is left of the claim; 0 once it has expired.
	ClaimLeftMillis int64
	// Expired is true when the record is past its TTL and counts as
	// absent. A claim still held never counts as expired, whatever its
	// record's TTL says, so that no reading of the row can run a request
	// twice at once.
	Expired bool
}

// IdempotencyClaim names a claim to take.
type IdempotencyClaim struct {
	KeyHash, Fingerprint []byte
	Method, Path, Token  string
	TTLMillis            int64 // the record's life once completed
	ClaimMillis          int64 // how long the claim blocks duplicates
}

// IdempotencyResponse is the response FinalizeIdempotency stores.
type IdempotencyResponse struct {
	KeyHash   []byte
	Token     string
	Status    int
	Headers   string // JSON object
	Body      []byte // nil for the too-large sentinel
	TooLarge  bool
	TTLMillis int64
}
