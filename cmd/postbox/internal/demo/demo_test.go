package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/cmd/postbox/internal/demo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo is the README's first command: it must pass its own checks on
// embedded defaults, the hard relay stop included.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	sum, err := demo.Run(context.Background(), demo.Options{Orders: 400, Writers: 3, Progress: 100 * time.Millisecond, Dir: t.TempDir(), Timeout: time.Minute}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !sum.OK() || sum.RelayRestarts != 1 || sum.RolledBack == 0 {
		t.Fatalf("summary %+v\n%s", sum, out.String())
	}
	if !strings.Contains(out.String(), "all checks passed") {
		t.Fatalf("output does not say the checks passed:\n%s", out.String())
	}
}
