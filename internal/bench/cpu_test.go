package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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

func TestCPUPhaseCountsThisProcess(t *testing.T) {
	if _, ok := procCPU("/proc/self/stat"); !ok {
		t.Skip("no /proc")
	}
	done := cpuPhase()
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	use, ok := done(1)
	if !ok || use.Self <= 0 {
		t.Fatalf("cpuPhase = %+v, %v; want this process's busy loop counted", use, ok)
	}
}
