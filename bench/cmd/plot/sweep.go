package main

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// sweeps draws drain-sweep.png and latency-sweep.png from the files named
// (comma-separated), each where its list is not empty.
func sweeps(drain, latency, out string) error {
	if drain == "" && latency == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil { //nolint:gosec // a directory of figures, meant to be read
		return fmt.Errorf("--out: %w", err)
	}
	if drain != "" {
		files, err := readEach[drainSweepFile]("--drain-sweep", drain)
		if err != nil {
			return err
		}
		var points []drainPoint
		for i, r := range files {
			if len(r.Runs) == 0 {
				return fmt.Errorf("--drain-sweep %s: the file holds no runs", strings.Split(drain, ",")[i])
			}
			pt, err := r.point()
			if err != nil {
				return fmt.Errorf("--drain-sweep %s: %w", strings.Split(drain, ",")[i], err)
			}
			points = append(points, pt)
		}
		if err := writeFigure(filepath.Join(out, "drain-sweep.png"), func(path string) error { return plotDrainSweep(points, path) }); err != nil {
			return err
		}
	}
	if latency != "" {
		rs, err := readEach[latencyResult]("--latency-sweep", latency)
		if err != nil {
			return err
		}
		if err := writeFigure(filepath.Join(out, "latency-sweep.png"), func(path string) error { return plotLatencySweep(rs, path) }); err != nil {
			return err
		}
	}
	return nil
}

// readEach reads each of the comma-separated JSON files of list, naming
// flag and the file in an error.
func readEach[T any](flag, list string) ([]T, error) {
	var out []T
	for _, f := range strings.Split(list, ",") {
		var v T
		if err := readJSON(f, &v); err != nil {
			return nil, fmt.Errorf("%s %s: %w", flag, f, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// writeFigure writes one figure with plot and says so.
func writeFigure(path string, plot func(path string) error) error {
	if err := plot(path); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}

// drainSweepFile is the part of `postbox bench drain --json` a sweep uses.
type drainSweepFile struct {
	Runs []struct {
		Storage      string
		Messages     int
		RawRate      float64
		RawPlainRate float64
		DrainRate    float64
	}
}

// drainPoint is one backlog size over one storage: the medians of its
// file's runs.
type drainPoint struct {
	storage                string
	messages               int
	drain, rawID, rawPlain float64
	runs                   int
}

// storageOf names a benchmark's storage, table (the outbox) or log: the
// JSON of a benchmark from before it named its storage is the outbox's.
func storageOf(s string) string { return cmp.Or(s, "table") }

// storages are the storages the sweeps draw, in their order: each name,
// how a figure calls it and its drain line's color.
var storages = []struct {
	name, label string
	c           color.Color
}{{"table", "the outbox", blue}, {"log", "the log (--storage log)", red}}

// median is the median of xs, which it sorts.
func median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// point is the file's point; its runs are of one size over one storage.
func (f drainSweepFile) point() (drainPoint, error) {
	first := f.Runs[0]
	for _, r := range f.Runs[1:] {
		if r.Messages != first.Messages || storageOf(r.Storage) != storageOf(first.Storage) {
			return drainPoint{}, fmt.Errorf("the file mixes runs of %d messages over %s with runs of %d over %s",
				first.Messages, storageOf(first.Storage), r.Messages, storageOf(r.Storage))
		}
	}
	each := func(get func(i int) float64) float64 {
		xs := make([]float64, len(f.Runs))
		for i := range f.Runs {
			xs[i] = get(i)
		}
		return median(xs)
	}
	return drainPoint{
		storage:  storageOf(first.Storage),
		messages: first.Messages,
		drain:    each(func(i int) float64 { return f.Runs[i].DrainRate }),
		rawID:    each(func(i int) float64 { return f.Runs[i].RawRate }),
		rawPlain: each(func(i int) float64 { return f.Runs[i].RawPlainRate }),
		runs:     len(f.Runs),
	}, nil
}

// plotDrainSweep draws a drain line for each storage among points, and
// the raw rates at each size: the median of that size's points, each of
// which measured its own.
func plotDrainSweep(points []drainPoint, path string) error {
	sort.Slice(points, func(i, j int) bool { return points[i].messages < points[j].messages })
	p := plot.New()
	p.Title.Text = "Backlog drain to NATS JetStream over the backlog size (median of each size's runs), beside the same runs' raw async publish"
	p.X.Label.Text = "backlog (messages of 256 bytes), log scale"
	p.Y.Label.Text = "messages per second"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{}
	p.Add(plotter.NewGrid())
	type series struct {
		name   string
		xys    plotter.XYs
		c      color.Color
		dashed bool
	}
	var all []series
	for _, st := range storages {
		s := series{name: "postbox drain, " + st.label, c: st.c}
		for _, d := range points {
			if d.storage == st.name && d.drain > 0 {
				s.xys = append(s.xys, plotter.XY{X: float64(d.messages), Y: d.drain})
			}
		}
		all = append(all, s)
	}
	rawID := series{name: "raw, Nats-Msg-Id", c: orange}
	rawPlain := series{name: "raw, no id", c: purple}
	target := series{name: "target: half the raw rate with Nats-Msg-Id", c: green, dashed: true}
	for i := 0; i < len(points); {
		j, ids, plains := i, []float64{}, []float64{}
		for ; j < len(points) && points[j].messages == points[i].messages; j++ {
			if points[j].rawID > 0 {
				ids = append(ids, points[j].rawID)
			}
			if points[j].rawPlain > 0 {
				plains = append(plains, points[j].rawPlain)
			}
		}
		x := float64(points[i].messages)
		if len(ids) > 0 {
			m := median(ids)
			rawID.xys = append(rawID.xys, plotter.XY{X: x, Y: m})
			target.xys = append(target.xys, plotter.XY{X: x, Y: m / 2})
		}
		if len(plains) > 0 {
			rawPlain.xys = append(rawPlain.xys, plotter.XY{X: x, Y: median(plains)})
		}
		i = j
	}
	top := 0.0
	for _, s := range append(all, rawID, rawPlain, target) {
		if len(s.xys) == 0 {
			continue
		}
		for _, xy := range s.xys {
			top = math.Max(top, xy.Y)
		}
		if err := addSeries(p, s.xys, s.name, s.c, s.dashed); err != nil {
			return err
		}
	}
	if top == 0 {
		return errors.New("--drain-sweep: no rates to draw")
	}
	p.Y.Min, p.Y.Max = 0, top*1.3
	p.Legend.Top = true
	return p.Save(12*vg.Inch, 6.5*vg.Inch, path)
}

// plotLatencySweep draws a panel for each storage among rs, one above the
// other.
func plotLatencySweep(rs []latencyResult, path string) error {
	var panels []*plot.Plot
	for _, st := range storages {
		var of []latencyResult
		for _, r := range rs {
			if storageOf(r.Storage) == st.name {
				of = append(of, r)
			}
		}
		if len(of) == 0 {
			continue
		}
		p, err := latencyPanel(of, st.label)
		if err != nil {
			return err
		}
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return errors.New("--latency-sweep: no runs to draw")
	}
	if len(panels) == 1 {
		return panels[0].Save(12*vg.Inch, 7*vg.Inch, path)
	}
	return saveStacked(path, 12*vg.Inch, vg.Length(len(panels))*6.5*vg.Inch, panels...)
}

// latencyPanel is p50 and p99 over the rate for rs, the runs over one
// storage, named by label.
func latencyPanel(rs []latencyResult, label string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Commit to JetStream ack over the paced rate, " + label + ": p50 and p99, beside the same runs' direct publish after commit"
	p.X.Label.Text = "messages committed per second (one per transaction) as achieved, log scale"
	p.Y.Label.Text = "ms, log scale"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{}
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = msTicks{}
	p.Add(plotter.NewGrid())
	const floor = 0.05 // ms: a log axis has no room for zero
	brown := color.RGBA{R: 140, G: 86, B: 75, A: 255}
	modes := []struct {
		separate bool
		name     string
		c, base  color.Color
	}{{false, "the relay's own client", blue, orange}, {true, "a separate client", purple, brown}}
	minX, maxX := math.Inf(1), 0.0
	for _, m := range modes {
		var p50, p99, b50, b99 plotter.XYs
		for _, r := range rs {
			if r.SeparateWriter != m.separate {
				continue
			}
			// The rate achieved: on a saturated machine the writers fall
			// behind the rate asked for.
			x := r.Achieved
			if x <= 0 {
				x = float64(r.Rate)
			}
			minX, maxX = math.Min(minX, x), math.Max(maxX, x)
			p50 = append(p50, plotter.XY{X: x, Y: math.Max(r.Latency.P50, floor)})
			p99 = append(p99, plotter.XY{X: x, Y: math.Max(r.Latency.P99, floor)})
			if r.BaselineMeasured > 0 {
				b50 = append(b50, plotter.XY{X: x, Y: math.Max(r.Baseline.P50, floor)})
				b99 = append(b99, plotter.XY{X: x, Y: math.Max(r.Baseline.P99, floor)})
			}
		}
		for _, s := range []struct {
			xys    plotter.XYs
			name   string
			c      color.Color
			dashed bool
		}{
			{p50, "postbox p50, " + m.name, m.c, false},
			{p99, "postbox p99, " + m.name, m.c, true},
			{b50, "direct publish p50, " + m.name + "'s runs", m.base, false},
			{b99, "direct publish p99, " + m.name + "'s runs", m.base, true},
		} {
			if len(s.xys) == 0 {
				continue
			}
			sort.Slice(s.xys, func(i, j int) bool { return s.xys[i].X < s.xys[j].X })
			if err := addSeries(p, s.xys, s.name, s.c, s.dashed); err != nil {
				return nil, err
			}
		}
	}
	if maxX == 0 {
		return nil, errors.New("--latency-sweep: no runs to draw")
	}
	for _, t := range []struct {
		ms    float64
		label string
		c     color.Color
	}{{2, "target p50 ≤ 2 ms", green}, {10, "target p99 ≤ 10 ms", red}} {
		h, err := plotter.NewLine(plotter.XYs{{X: minX, Y: t.ms}, {X: maxX, Y: t.ms}})
		if err != nil {
			return nil, err
		}
		h.Color, h.Dashes = t.c, []vg.Length{vg.Points(2), vg.Points(3)}
		p.Add(h)
		p.Legend.Add(t.label, h)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p, nil
}

// addSeries draws xys as a line with its points, dashed or not, and names
// it in the legend.
func addSeries(p *plot.Plot, xys plotter.XYs, name string, c color.Color, dashed bool) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color, l.Width, pts.Color = c, vg.Points(2), c
	if dashed {
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	}
	p.Add(l, pts)
	p.Legend.Add(name, l, pts)
	return nil
}
