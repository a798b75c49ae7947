// Package procfunc makes postbox Processors out of functions, for the
// tests and tools that wrap a Processor to watch what it does.
package procfunc

import (
	"context"

	"github.com/postbox-go/postbox"
)

// Func is a postbox.Processor that calls itself.
type Func func(ctx context.Context, d *postbox.Delivery) postbox.Verdict

// Process implements postbox.Processor.
func (f Func) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	return f(ctx, d)
}

// Wrapping returns outer, a Processor that wraps inner, with inner's
// in-flight hint when inner has one (postbox.InFlightHinter), so that a
// subscriber sizes its window for inner as it would without the wrapper.
func Wrapping(inner, outer postbox.Processor) postbox.Processor {
	if h, ok := inner.(postbox.InFlightHinter); ok {
		return hinted{outer, h.InFlightHint()}
	}
	return outer
}

// hinted is a Processor with the in-flight hint of the one it wraps.
type hinted struct {
	postbox.Processor
	hint int
}

func (h hinted) InFlightHint() int { return h.hint }
