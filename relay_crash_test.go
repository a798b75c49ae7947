package postbox

import (
	"testing"

	"github.com/postbox-go/postbox/postboxdriver"
)

// partialReader is an Executor whose reads took whole the partitions it
// names, as the log's does.
type partialReader struct {
	postboxdriver.Executor
	whole []int
}

func (p partialReader) ReadWhole([]postboxdriver.Record) []int { return p.whole }

// Which partitions a batch published with crash marks settles: over a
// store that reads every pending row up to its limit, those it read rows
// of, and all when it was not full; over one whose reads can end short
// with rows left (PartialReader), only those it read whole, full or not.
func TestCrashMarksSettle(t *testing.T) {
	fence := postboxdriver.Fence{Owner: "r", Generations: map[int]int64{1: 7, 2: 7, 3: 7}}
	sus := map[int]bool{1: true, 2: true, 3: true}
	rows := func(parts ...int) []postboxdriver.Record {
		var recs []postboxdriver.Record
		for _, p := range parts {
			recs = append(recs, postboxdriver.Record{Partition: p})
		}
		return recs
	}
	for _, c := range []struct {
		name string
		ex   postboxdriver.Executor
		recs []postboxdriver.Record
		want []int
	}{
		{"short", nil, rows(1), []int{1, 2, 3}},
		{"full", nil, rows(1, 1), []int{1}},
		{"short read not whole", partialReader{whole: nil}, rows(1), nil},
		{"short read, one whole", partialReader{whole: []int{2}}, rows(1), []int{2}},
		{"full read, one whole", partialReader{whole: []int{3}}, rows(1, 1), []int{3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &relay{ex: c.ex, cfg: &Config{BatchSize: 2}, settled: map[int]int64{}}
			r.settle(fence, sus, c.recs, r.readWhole(c.recs))
			if len(r.settled) != len(c.want) {
				t.Fatalf("settled %v, want %v", r.settled, c.want)
			}
			for _, p := range c.want {
				if r.settled[p] != 7 {
					t.Fatalf("settled %v, want %v", r.settled, c.want)
				}
			}
		})
	}
}
