package cpuuse

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestProcCPU(t *testing.T) {
	dir := t.TempDir()
	// A command name with a space and a parenthesis: fields are counted
	// from the last ')'.
	stat := "4242 (we ird) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 25 3 2 20 0 1 0 100 1000 10\n"
	p := filepath.Join(dir, "stat")
	if err := os.WriteFile(p, []byte(stat), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok := procCPU(p)
	if !ok || got != 180*clockTick {
		t.Fatalf("procCPU = %v, %v; want %v", got, ok, 180*clockTick)
	}
	if _, ok := procCPU(filepath.Join(dir, "missing")); ok {
		t.Fatal("a missing file read as ok")
	}
	if err := os.WriteFile(p, []byte("1 (short) S 1 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := procCPU(p); ok {
		t.Fatal("a short line read as ok")
	}
}

// timesAt reads this process and the named servers from a proc tree,
// and between turns two readings into CPU per message: a server that
// started counts whole, one that ended loses its share, a reused pid
// counts whole under its new name, other processes not at all.
func TestCPUBetweenReadings(t *testing.T) {
	stat := func(ticks int) string {
		// utime, stime, cutime, cstime are fields 14 to 17.
		return fmt.Sprintf("1 (x) S 1 1 1 0 -1 0 0 0 0 0 %d 0 0 0 20 0 1 0 1 1 1\n", ticks)
	}
	write := func(root string, procs map[int][2]string) {
		for pid, p := range procs {
			dir := filepath.Join(root, strconv.Itoa(pid))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, body := range map[string]string{"comm": p[0] + "\n", "stat": p[1]} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	const self = 10
	names := []string{"postgres", "nats-server"}
	before, after := t.TempDir(), t.TempDir()
	write(before, map[int][2]string{
		self: {"postbox", stat(100)},
		20:   {"postgres", stat(50)},
		21:   {"postgres", stat(70)}, // ends during the phase
		30:   {"nats-server", stat(10)},
		40:   {"bash", stat(5)},
		50:   {"bash", stat(500)}, // its pid is a postgres backend's after
	})
	write(after, map[int][2]string{
		self: {"postbox", stat(300)},
		20:   {"postgres", stat(90)},
		22:   {"postgres", stat(30)}, // starts during the phase
		30:   {"nats-server", stat(110)},
		40:   {"bash", stat(900)},
		50:   {"postgres", stat(20)},
	})
	b, a := timesAt(before, self, names...), timesAt(after, self, names...)
	use, ok := between(b, a, 10, "nats-server")
	want := Use{Self: 20 * clockTick, Database: 9 * clockTick, Broker: 10 * clockTick}
	if !ok || use != want {
		t.Fatalf("cpuBetween = %+v, %v; want %+v", use, ok, want)
	}
	if _, ok := between(nil, a, 10, "nats-server"); ok {
		t.Fatal("a missing reading counted")
	}
	if m := timesAt(t.TempDir(), self, names...); m != nil {
		t.Fatalf("a tree without this process read as %v", m)
	}
}
