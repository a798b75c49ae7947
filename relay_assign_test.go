package postbox

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/postbox-go/postbox/postboxdriver"
)

// settle runs assign until the owners it returns are the owners it was
// given, as relays renewing in turn would, and returns them.
func settle(t *testing.T, live []string, leases []postboxdriver.Lease) []postboxdriver.Lease {
	t.Helper()
	for range 10 {
		next := withOwners(leases, assign(live, leases))
		if fmt.Sprint(next) == fmt.Sprint(leases) {
			return next
		}
		leases = next
	}
	t.Fatalf("assign did not settle for %d relays", len(live))
	return nil
}

func withOwners(leases []postboxdriver.Lease, shares map[string][]int) []postboxdriver.Lease {
	out := make([]postboxdriver.Lease, len(leases))
	for i := range leases {
		out[i] = postboxdriver.Lease{Partition: i}
	}
	for r, ps := range shares {
		for _, p := range ps {
			out[p].Owner = r
		}
	}
	return out
}

func relays(rng *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("relay-%x", rng.Uint64())
	}
	return sortedCopy(out)
}

func sortedCopy(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}

func moved(a, b []postboxdriver.Lease) int {
	n := 0
	for i := range a {
		if a[i].Owner != b[i].Owner {
			n++
		}
	}
	return n
}

// Every partition has exactly one live owner, every relay P/n or one
// more, and the shares depend only on what the relays see.
func TestAssignBalanced(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 70; n++ {
		live := relays(rng, n)
		leases := settle(t, live, make([]postboxdriver.Lease, 64))
		load := map[string]int{}
		for _, l := range leases {
			if l.Owner == "" {
				t.Fatalf("%d relays: partition %d has no owner", n, l.Partition)
			}
			load[l.Owner]++
		}
		for _, r := range live {
			if k := load[r]; k < 64/n || k > (64+n-1)/n {
				t.Fatalf("%d relays: %s holds %d, want %d or %d", n, r, k, 64/n, (64+n-1)/n)
			}
		}
		if fmt.Sprint(assign(live, leases)) != fmt.Sprint(assign(sortedCopy(live), leases)) {
			t.Fatalf("%d relays: shares depend on more than the membership", n)
		}
	}
}

// A relay joining takes about one share, and a relay leaving hands on its
// own share only: partitions that need not move keep their owner.
func TestAssignMovesOnlyWhatItMust(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 2 + rng.IntN(15)
		live := relays(rng, n)
		before := settle(t, live, make([]postboxdriver.Lease, 64))

		// One leaves: only its partitions move.
		gone := rng.IntN(n)
		rest := append(append([]string(nil), live[:gone]...), live[gone+1:]...)
		after := settle(t, rest, before)
		own := 0
		for _, l := range before {
			if l.Owner == live[gone] {
				own++
			}
		}
		if m := moved(before, after); m != own {
			t.Fatalf("trial %d: %d of %d relays left, %d partitions moved, want its %d", trial, 1, n, m, own)
		}

		// One joins: at most a share moves, all of it to the newcomer.
		joined := sortedCopy(append(append([]string(nil), live...), fmt.Sprintf("relay-new-%d", trial)))
		after = settle(t, joined, before)
		limit := (64 + n) / (n + 1)
		if m := moved(before, after); m > limit {
			t.Fatalf("trial %d: a relay joined %d, %d partitions moved, want at most about a share (%d)", trial, n, m, limit)
		}
		for i := range after {
			if after[i].Owner != before[i].Owner && after[i].Owner != fmt.Sprintf("relay-new-%d", trial) {
				t.Fatalf("trial %d: partition %d moved between two relays already there", trial, i)
			}
		}
	}
}
