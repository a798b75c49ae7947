package bench_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// benchFunc is a benchmark's entry point: Drain, Inbox, Latency and the
// others.
type benchFunc[O, R any] func(context.Context, O, io.Writer) (R, error)

// runBench runs f with opts, keeping its output, and fails the test with
// that output when f fails.
func runBench[O, R any](t *testing.T, f benchFunc[O, R], opts O) R {
	t.Helper()
	var out bytes.Buffer
	res, err := f(context.Background(), opts, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return res
}

// wantRejected checks that f refuses opts with an error that names every
// one of flags.
func wantRejected[O, R any](t *testing.T, f benchFunc[O, R], opts O, flags ...string) {
	t.Helper()
	_, err := f(context.Background(), opts, &bytes.Buffer{})
	for _, flag := range flags {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("options %+v: error %v, want one naming %s", opts, err, flag)
		}
	}
}
