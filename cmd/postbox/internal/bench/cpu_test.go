package bench

import "testing"

// The median of CPU uses is taken side by side: each side's own middle.
func TestMedianUseSideBySide(t *testing.T) {
	got := medianUse([]CPUUse{{Self: 1, Database: 30, Broker: 5}, {Self: 3, Database: 10, Broker: 6}, {Self: 2, Database: 20, Broker: 4}})
	if want := (CPUUse{Self: 2, Database: 20, Broker: 5}); got != want {
		t.Fatalf("medianUse = %+v, want %+v", got, want)
	}
}
