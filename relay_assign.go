package postbox

import (
	"hash/fnv"
	"sort"

	"github.com/postbox-go/postbox/postboxdriver"
)

// assign works out which partitions each live relay should hold, from
// what every relay sees: the live set and the current owner of each
// partition. Every relay runs it on the membership Coordinate returned and
// takes its own share; relays whose views agree agree on the shares.
//
// The shares are sticky and balanced. Each relay's quota is P/n or one
// more (the extra partitions go to the relays that hold the most, so that
// as few as possible move). Each live relay keeps the partitions it holds,
// up to its quota; only what is above a quota, and what no live relay
// holds (free, or a departed relay's), moves: to the relay under its quota
// that scores highest for the partition (a hash of the partition and the
// relay's id, so the choice spreads evenly and does not depend on the
// order relays joined). A relay joining therefore takes one share from the
// others, and a relay leaving hands its share to the others, instead of
// every partition moving; a partition that does not move keeps its lease,
// and its batches in flight are never fenced out.
//
// Which partitions a relay keeps when above its quota is decided by the
// same score, so the relays that see the same membership shed the same
// ones.
func assign(live []string, leases []postboxdriver.Lease) map[string][]int {
	out := make(map[string][]int, len(live))
	if len(live) == 0 {
		return out
	}
	isLive := make(map[string]bool, len(live))
	for _, r := range live {
		isLive[r] = true
		out[r] = nil
	}
	held := make(map[string][]int, len(live))
	var pool []int
	for _, l := range leases {
		if l.Owner != "" && isLive[l.Owner] {
			held[l.Owner] = append(held[l.Owner], l.Partition)
		} else {
			pool = append(pool, l.Partition)
		}
	}
	// Quotas: base for everyone, one more for the `extra` relays that
	// hold the most (ties by id).
	base, extra := len(leases)/len(live), len(leases)%len(live)
	ranked := append([]string(nil), live...)
	sort.SliceStable(ranked, func(i, j int) bool {
		if a, b := len(held[ranked[i]]), len(held[ranked[j]]); a != b {
			return a > b
		}
		return ranked[i] < ranked[j]
	})
	quota := make(map[string]int, len(live))
	for i, r := range ranked {
		quota[r] = base
		if i < extra {
			quota[r]++
		}
	}
	for r, ps := range held {
		sort.Slice(ps, func(i, j int) bool { return score(ps[i], r) > score(ps[j], r) })
		if len(ps) > quota[r] {
			pool = append(pool, ps[quota[r]:]...)
			ps = ps[:quota[r]]
		}
		out[r] = ps
	}
	sort.Ints(pool)
	for _, p := range pool {
		best, bestScore := "", uint64(0)
		for _, r := range live {
			if len(out[r]) >= quota[r] {
				continue
			}
			if s := score(p, r); best == "" || s > bestScore {
				best, bestScore = r, s
			}
		}
		out[best] = append(out[best], p)
	}
	for _, ps := range out {
		sort.Ints(ps)
	}
	return out
}

// score ranks relay r for partition p: FNV-1a of the id and the partition.
func score(p int, r string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(r))
	_, _ = h.Write([]byte{byte(p >> 24), byte(p >> 16), byte(p >> 8), byte(p)})
	return h.Sum64()
}
