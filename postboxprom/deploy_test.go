package postboxprom_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxprom"
)

type noStats struct{}

func (noStats) DeadStats(context.Context) ([]postbox.ConsumerDeadStat, error) { return nil, nil }

// exported returns the name of every metric postboxprom exports: the
// collectors New registers, a StatusCollector with routes, and a
// ConsumerCollector. A histogram's series add _bucket, _sum and _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := postboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Every vector has a series once it is used.
	one := map[string]int{"t": 1}
	m.RelayBatch(&postbox.BatchReport{Relay: "r", Size: 1, Published: one, Failed: one, Dead: one, FencedOut: 1,
		Infrastructure: context.Canceled, Lag: []time.Duration{time.Millisecond}})
	m.InboxHandledTopic("c", "t", postbox.Verdict{}, time.Millisecond)
	m.InboxBatch(&postbox.InboxBatchReport{Consumer: "c", Size: 2, Outcome: postbox.BatchCommitted, Duration: time.Millisecond})
	m.IdempotencyOutcome("completed")
	var descs []*prometheus.Desc
	collect := func(c prometheus.Collector) {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			descs = append(descs, d)
		}
	}
	collect(postboxprom.NewStatusCollector(nil, time.Second).WithRouted(func(string) bool { return true }))
	collect(postboxprom.NewConsumerCollector(noStats{}, time.Second))
	collect(postboxprom.NewShardUp(func() bool { return true }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for _, d := range descs {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		names[m[1]] = true
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// series adds to names the series names of a histogram's (and a
// summary's) parts; any of them may appear in a query.
func series(names map[string]bool) map[string]bool {
	out := map[string]bool{}
	for n := range names {
		out[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			out[n+suffix] = true
		}
	}
	return out
}

var metricName = regexp.MustCompile(`\bpostbox_[a-z_]*[a-z]\b`)

// Every metric the shipped alert rules and Grafana dashboard name is one
// postboxprom exports, and every exported metric is in METRICS.md.
func TestDeployFilesNameExportedMetrics(t *testing.T) {
	names := exported(t)
	all := series(names)
	for _, file := range []string{"../deploy/prometheus/alerts.yml", "../deploy/prometheus/alerts_test.yml", "../deploy/grafana/postbox.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		used := metricName.FindAllString(string(b), -1)
		if len(used) == 0 {
			t.Fatalf("%s names no metric", file)
		}
		for _, n := range used {
			if !all[n] {
				t.Errorf("%s names %s, which postboxprom does not export", file, n)
			}
		}
	}
	doc, err := os.ReadFile("../METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for n := range names {
		if !strings.Contains(string(doc), "`"+n+"`") {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("METRICS.md does not list %v", missing)
	}
}
