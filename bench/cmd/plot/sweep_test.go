package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A drain file's point is the median of its runs, figure by figure.
func TestDrainSweepPoint(t *testing.T) {
	var f drainSweepFile
	if err := json.Unmarshal([]byte(`{"Runs": [
		{"Messages": 1000, "RawRate": 30, "RawPlainRate": 40, "DrainRate": 9},
		{"Messages": 1000, "RawRate": 10, "RawPlainRate": 60, "DrainRate": 12},
		{"Messages": 1000, "RawRate": 20, "RawPlainRate": 50, "DrainRate": 3}]}`), &f); err != nil {
		t.Fatal(err)
	}
	got, err := f.point()
	want := drainPoint{storage: "table", messages: 1000, drain: 9, rawID: 20, rawPlain: 50, runs: 3}
	if err != nil || got != want {
		t.Fatalf("point = %+v, %v, want %+v", got, err, want)
	}
	// A file's runs are of one size over one storage.
	for _, runs := range []string{
		`{"Messages": 1000, "DrainRate": 9}, {"Messages": 1000, "Storage": "log", "DrainRate": 12}`,
		`{"Messages": 1000, "DrainRate": 9}, {"Messages": 2000, "DrainRate": 12}`,
	} {
		var mixed drainSweepFile
		if err := json.Unmarshal([]byte(`{"Runs": [`+runs+`]}`), &mixed); err != nil {
			t.Fatal(err)
		}
		if _, err := mixed.point(); err == nil || !strings.Contains(err.Error(), "mixes") {
			t.Fatalf("point of %s = %v, want an error saying the file mixes runs", runs, err)
		}
	}
}

// Both sweeps draw from the benchmarks' JSON, of one storage (files from
// before the benchmarks named it) or both, and a file that holds no runs
// is named in the error.
func TestSweeps(t *testing.T) {
	dir := t.TempDir()
	for _, stores := range [][]string{{""}, {"table", "log"}} {
		var drains, lats []string
		for _, st := range stores {
			for _, n := range []int{10_000, 100_000} {
				drains = append(drains, writeJSON(t, dir, fmt.Sprintf("d-%s-%d.json", st, n), map[string]any{
					"Runs": []map[string]any{{"Messages": n, "Storage": st, "RawRate": 60000, "RawPlainRate": 80000, "DrainRate": 25000}},
				}))
			}
			for _, sep := range []bool{false, true} {
				for _, rate := range []int{100, 1000} {
					lats = append(lats, writeJSON(t, dir, fmt.Sprintf("l-%s-%v-%d.json", st, sep, rate), map[string]any{
						"rate": rate, "achieved": float64(rate), "separate_writer": sep, "baseline_measured": 10, "storage": st,
						"latency_ms": map[string]float64{"P50": 1, "P99": 5}, "baseline_ms": map[string]float64{"P50": 0.3, "P99": 1},
					}))
				}
			}
		}
		out := filepath.Join(dir, "out-"+strings.Join(stores, "-"))
		if err := sweeps(strings.Join(drains, ","), strings.Join(lats, ","), out); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"drain-sweep.png", "latency-sweep.png"} {
			if st, err := os.Stat(filepath.Join(out, name)); err != nil || st.Size() == 0 {
				t.Fatalf("%v: %s: %v", stores, name, err)
			}
		}
	}
	out := filepath.Join(dir, "out")
	empty := writeJSON(t, dir, "empty.json", map[string]any{"Runs": []any{}})
	if err := sweeps(empty, "", out); err == nil || !strings.Contains(err.Error(), "empty.json") {
		t.Fatalf("sweeps of a file without runs = %v, want an error naming it", err)
	}
}
