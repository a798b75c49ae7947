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
// The shares are sticky and balanced. Each live relay keeps the partitions
// it holds, up to its cap of ceil(P/n); only what is above a cap, and what
// no live relay holds (free, or a departed relay's), moves: to the relay
// under its cap that scores highest for the partition (a hash of the
// partition and the relay's id, so the choice spreads evenly and does not
// depend on the order relays joined). A relay joining therefore takes
// about one share from the others, and a relay leaving hands its share to
// the others, instead of every partition moving; a partition that does not
// move keeps its lease, and its batches in flight are never fenced out.
//
// Which partitions a relay keeps when above its cap is decided by the
// same score, so the relays that see the same membership shed the same
// ones.
func assign(live []string, leases []postboxdriver.Lease) map[string][]int {
	out := make(map[string][]int, len(live))
	if len(live) == 0 {
		return out
	}
	nparts := len(leases)
	limit := (nparts + len(live) - 1) / len(live)
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
	for r, ps := range held {
		sort.Slice(ps, func(i, j int) bool { return score(ps[i], r) > score(ps[j], r) })
		if len(ps) > limit {
			pool = append(pool, ps[limit:]...)
			ps = ps[:limit]
		}
		out[r] = ps
	}
	sort.Ints(pool)
	for _, p := range pool {
		best, bestScore := "", uint64(0)
		for _, r := range live {
			if len(out[r]) >= limit {
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
