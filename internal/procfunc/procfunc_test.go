package procfunc_test

import (
	"context"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/procfunc"
)

type hinting struct{ procfunc.Func }

func (hinting) InFlightHint() int { return 128 }

func TestWrappingForwardsTheHint(t *testing.T) {
	ack := procfunc.Func(func(context.Context, *postbox.Delivery) postbox.Verdict {
		return postbox.Verdict{Action: postbox.Ack}
	})
	called := false
	outer := procfunc.Func(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
		called = true
		return ack(ctx, d)
	})
	w := procfunc.Wrapping(hinting{ack}, outer)
	if got := postbox.InFlight(w, 64, 4096); got != 128 {
		t.Fatalf("InFlight of the wrapper = %d, want the inner hint 128", got)
	}
	if v := w.Process(context.Background(), &postbox.Delivery{ID: "x"}); v.Action != postbox.Ack || !called {
		t.Fatalf("the wrapper did not run the outer processor: %+v, called %v", v, called)
	}
	if _, ok := procfunc.Wrapping(ack, outer).(postbox.InFlightHinter); ok {
		t.Fatal("a wrapper of a processor without a hint has one")
	}
}
