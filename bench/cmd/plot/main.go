// Command plot draws the PNG figures of BENCHMARKS.md from the JSON that
// `postbox bench` writes:
//
//	postbox bench latency --json latency.json
//	postbox bench drain --runs 3 --json drain.json
//	go run ./cmd/plot --latency latency.json --drain drain.json --out ../docs/bench
//
// latency.png shows the commit-to-ack latency by percentile, postbox next
// to the same run's direct-publish floor, with the targets of docs/design.md §6;
// drain.png shows the backlog and the drain rate over time for each run,
// with that run's raw JetStream rate.
//
// Sweeps, one JSON file per point, comma-separated:
//
//	go run ./cmd/plot --drain-sweep d10k.json,d100k.json,d1m.json --latency-sweep l100.json,l1000.json --out ../docs/bench
//
// drain-sweep.png shows the drain rate over the backlog size (each file's
// median), a line for each storage the files name (the outbox, or the log
// of `--storage log`), beside the same runs' raw JetStream rates, with and
// without Nats-Msg-Id; latency-sweep.png shows p50 and p99 over the paced
// rate, one pair of lines per mode (the relay's own client, or a separate
// one), beside the same runs' direct-publish floor, in a panel for each
// storage.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func main() {
	latency := flag.String("latency", "", "JSON written by `postbox bench latency --json`")
	drain := flag.String("drain", "", "JSON written by `postbox bench drain --json`")
	out := flag.String("out", ".", "directory for latency.png and drain.png")
	smooth := flag.Float64("smooth", 0.5, "seconds over which the drain rate is averaged")
	drainSweep := flag.String("drain-sweep", "", "comma-separated JSON files of `postbox bench drain --json`, one per backlog size")
	latencySweep := flag.String("latency-sweep", "", "comma-separated JSON files of `postbox bench latency --json`, one per rate and mode")
	flag.Parse()
	if *latency == "" && *drain == "" && *drainSweep == "" && *latencySweep == "" {
		fmt.Fprintln(os.Stderr, "plot: nothing to draw: give --latency, --drain, --drain-sweep or --latency-sweep")
		os.Exit(2)
	}
	if err := run(*latency, *drain, *out, *smooth); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	if err := sweeps(*drainSweep, *latencySweep, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(latency, drain, out string, smooth float64) error {
	if latency == "" && drain == "" {
		return nil
	}
	if smooth <= 0 {
		return fmt.Errorf("--smooth must be positive, got %v", smooth)
	}
	if err := os.MkdirAll(out, 0o755); err != nil { //nolint:gosec // a directory of figures, meant to be read
		return fmt.Errorf("--out: %w", err)
	}
	if latency != "" {
		var r latencyResult
		if err := readJSON(latency, &r); err != nil {
			return fmt.Errorf("--latency: %w", err)
		}
		path := filepath.Join(out, "latency.png")
		if err := plotLatency(r, path); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	if drain != "" {
		var r drainResults
		if err := readJSON(drain, &r); err != nil {
			return fmt.Errorf("--drain: %w", err)
		}
		if len(r.Runs) == 0 {
			return errors.New("--drain: the file holds no runs")
		}
		path := filepath.Join(out, "drain.png")
		if err := plotDrain(r, smooth, path); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path) //nolint:gosec // the file the user names
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// The parts of the benchmarks' JSON that the figures use.

type cdfPoint struct {
	Fraction float64 `json:"fraction"`
	Millis   float64 `json:"ms"`
}

type percentiles struct{ P50, P99 float64 }

type latencyResult struct {
	Rate             int         `json:"rate"`
	Achieved         float64     `json:"achieved"`
	Measured         int         `json:"measured"`
	Latency          percentiles `json:"latency_ms"`
	CDF              []cdfPoint  `json:"cdf"`
	Baseline         percentiles `json:"baseline_ms"`
	BaselineCDF      []cdfPoint  `json:"baseline_cdf"`
	IdleQueries      float64     `json:"idle_queries_per_s"`
	SeparateWriter   bool        `json:"separate_writer"`
	BaselineMeasured int         `json:"baseline_measured"`
	Storage          string      `json:"storage"`
}

type drainResults struct {
	Runs []struct {
		Messages  int
		RawRate   float64
		DrainRate float64
		Timeline  []struct {
			Seconds   float64 `json:"s"`
			Remaining float64 `json:"remaining"`
		}
	}
}

var (
	blue   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	orange = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	green  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	red    = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	purple = color.RGBA{R: 148, G: 103, B: 189, A: 255}
	colors = []color.Color{blue, orange, green, purple, red}
)

// The latency figure's x axis is 1/(1-p) on a log scale, so that 50%, 90%,
// 99% and 99.9% are equally spaced and the tail gets room; the maximum
// sits half a decade past the last percentile.
func tailX(p float64) float64 { return 1 / (1 - p) }

func percentileLine(points []cdfPoint, floor float64) (plotter.XYs, float64) {
	var xys plotter.XYs
	maxX := 1.0
	for _, pt := range points {
		if pt.Fraction >= 1 {
			continue
		}
		xys = append(xys, plotter.XY{X: tailX(pt.Fraction), Y: math.Max(pt.Millis, floor)})
		maxX = math.Max(maxX, tailX(pt.Fraction))
	}
	if n := len(points); n > 0 && points[n-1].Fraction >= 1 {
		maxX *= 3
		xys = append(xys, plotter.XY{X: maxX, Y: math.Max(points[n-1].Millis, floor)})
	}
	return xys, maxX
}

func plotLatency(r latencyResult, path string) error {
	if len(r.CDF) == 0 {
		return errors.New("--latency: the file holds no distribution (cdf)")
	}
	const floor = 0.05 // ms: a log axis has no room for zero or the few negative values
	p := plot.New()
	mode := "the relay's client (in-process wake-up)"
	if r.SeparateWriter {
		mode = "a separate client (relay polls)"
	}
	p.Title.Text = fmt.Sprintf("Latency from commit return to JetStream ack at %d msg/s (%.0f achieved), written through %s", r.Rate, r.Achieved, mode)
	p.X.Label.Text = "percentile of messages (tail stretched: 1/(1-p) on a log scale)"
	// Short: gonum centres an axis label on the arithmetic middle of the
	// range, which a log scale puts near the top.
	p.Y.Label.Text = "ms, log scale"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = msTicks{}
	p.X.Scale = plot.LogScale{}
	p.Add(plotter.NewGrid())

	postbox, maxX := percentileLine(r.CDF, floor)
	l, err := plotter.NewLine(postbox)
	if err != nil {
		return err
	}
	l.Color, l.Width = blue, vg.Points(2)
	p.Add(l)
	p.Legend.Add(fmt.Sprintf("postbox relay (p50 %.2f ms, p99 %.1f ms, %d msgs)", r.Latency.P50, r.Latency.P99, r.Measured), l)
	if len(r.BaselineCDF) > 0 {
		base, bmax := percentileLine(r.BaselineCDF, floor)
		maxX = math.Max(maxX, bmax)
		b, err := plotter.NewLine(base)
		if err != nil {
			return err
		}
		b.Color, b.Width = orange, vg.Points(2)
		p.Add(b)
		p.Legend.Add(fmt.Sprintf("same run, direct publish after commit (p50 %.2f ms, p99 %.1f ms)", r.Baseline.P50, r.Baseline.P99), b)
	}
	for _, t := range []struct {
		ms    float64
		label string
		c     color.Color
	}{{2, "target p50 ≤ 2 ms", green}, {10, "target p99 ≤ 10 ms", red}} {
		h, err := plotter.NewLine(plotter.XYs{{X: 1, Y: t.ms}, {X: maxX, Y: t.ms}})
		if err != nil {
			return err
		}
		h.Color, h.Dashes = t.c, []vg.Length{vg.Points(6), vg.Points(4)}
		p.Add(h)
		p.Legend.Add(t.label, h)
	}
	var ticks plot.ConstantTicks
	for _, tk := range []struct {
		p     float64
		label string
	}{{0.5, "50%"}, {0.9, "90%"}, {0.99, "99%"}, {0.999, "99.9%"}, {0.9999, "99.99%"}} {
		if x := tailX(tk.p); x < maxX {
			ticks = append(ticks, plot.Tick{Value: x, Label: tk.label})
		}
	}
	ticks = append(ticks, plot.Tick{Value: maxX, Label: "max"})
	p.X.Tick.Marker = ticks
	p.X.Min, p.X.Max = 1, maxX
	// Bottom right: the curves rise to the right, so that corner is free.
	p.Legend.Padding = vg.Points(4)
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(12), vg.Points(8)
	return p.Save(12*vg.Inch, 6.5*vg.Inch, path)
}

// msTicks labels a log axis of milliseconds at 1-2-5 steps.
type msTicks struct{}

func (msTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi*1.0001; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < lo*0.9999 || v > hi*1.0001 {
				continue
			}
			ts = append(ts, plot.Tick{Value: v, Label: strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")})
		}
		for m := 3.0; m < 10; m++ {
			if v := m * math.Pow(10, e); m != 5 && v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v})
			}
		}
	}
	return ts
}

func plotDrain(r drainResults, smooth float64, path string) error {
	top := plot.New()
	top.Title.Text = fmt.Sprintf("Backlog drain, PostgreSQL to NATS JetStream: %d messages of 256 bytes, relay at default settings", r.Runs[0].Messages)
	top.X.Label.Text = "time since the relay started (s)"
	top.Y.Label.Text = "rows left in the outbox"
	top.Add(plotter.NewGrid())
	bottom := plot.New()
	bottom.Title.Text = fmt.Sprintf("Drain rate (averaged over %.1f s) against the raw JetStream async publish rate of the same run", smooth)
	bottom.X.Label.Text = "time since the relay started (s)"
	bottom.Y.Label.Text = "messages per second"
	bottom.Add(plotter.NewGrid())
	for i, run := range r.Runs {
		c := colors[i%len(colors)]
		if len(run.Timeline) < 2 {
			return fmt.Errorf("--drain: run %d has no timeline; write it with `postbox bench drain --json`", i+1)
		}
		var left, rate plotter.XYs
		tl := run.Timeline
		for j, s := range tl {
			left = append(left, plotter.XY{X: s.Seconds, Y: s.Remaining})
			k := j
			for k > 0 && tl[j].Seconds-tl[k].Seconds < smooth {
				k--
			}
			if k < j && tl[j].Seconds > tl[k].Seconds {
				rate = append(rate, plotter.XY{X: (tl[j].Seconds + tl[k].Seconds) / 2, Y: (tl[k].Remaining - tl[j].Remaining) / (tl[j].Seconds - tl[k].Seconds)})
			}
		}
		end := tl[len(tl)-1].Seconds
		l, err := plotter.NewLine(left)
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(1.5)
		top.Add(l)
		top.Legend.Add(fmt.Sprintf("run %d: %.0f msg/s over the drain", i+1, run.DrainRate), l)
		if len(rate) > 0 {
			rl, err := plotter.NewLine(rate)
			if err != nil {
				return err
			}
			rl.Color, rl.Width = c, vg.Points(1.5)
			bottom.Add(rl)
			bottom.Legend.Add(fmt.Sprintf("run %d: postbox drain", i+1), rl)
		}
		raw, err := plotter.NewLine(plotter.XYs{{X: 0, Y: run.RawRate}, {X: end, Y: run.RawRate}})
		if err != nil {
			return err
		}
		raw.Color, raw.Dashes = c, []vg.Length{vg.Points(6), vg.Points(4)}
		bottom.Add(raw)
		bottom.Legend.Add(fmt.Sprintf("run %d: raw JetStream %.0f msg/s (target ≥ 50%%: %.0f)", i+1, run.RawRate, run.RawRate/2), raw)
	}
	top.Y.Min, bottom.Y.Min = 0, 0
	top.Legend.Top = true
	bottom.Legend.Top = true
	bottom.Legend.Left = true
	bottom.Y.Max *= 1.35 // room for the legend above the lines

	return saveStacked(path, 12*vg.Inch, 9*vg.Inch, top, bottom)
}

// saveStacked draws plots one above the other on a w×h canvas and writes
// it to path as PNG.
func saveStacked(path string, w, h vg.Length, plots ...*plot.Plot) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 8, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	for i, p := range plots {
		p.Draw(tiles.At(dc, 0, i))
	}
	f, err := os.Create(path) //nolint:gosec // the output the user names
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
