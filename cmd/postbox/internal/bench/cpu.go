package bench

import (
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/postbox-go/postbox/internal/cpuuse"
)

// CPUUse is the CPU time each side used during a phase, per message.
type CPUUse = cpuuse.Use

// medianUse is the median of each side's CPU over uses, side by side.
func medianUse(uses []CPUUse) CPUUse {
	side := func(f func(CPUUse) time.Duration) time.Duration {
		return time.Duration(medianOf(uses, func(u CPUUse) float64 { return float64(f(u)) }))
	}
	return CPUUse{
		Self:     side(func(u CPUUse) time.Duration { return u.Self }),
		Database: side(func(u CPUUse) time.Duration { return u.Database }),
		Broker:   side(func(u CPUUse) time.Duration { return u.Broker }),
	}
}

// us formats d in microseconds with one decimal.
func us(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 1, 64) + " µs"
}

// Micros is d in microseconds, for tables.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// startCPUProfile writes a CPU profile of this process to path until stop
// is first called; with an empty path it does nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path) //nolint:gosec // the operator's own --cpuprofile
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}), nil
}

// startAllocProfile writes the allocations of this process up to now to
// path+".base", and up to stop's first call to path, so that
//
//	go tool pprof -sample_index=alloc_space -base path.base binary path
//
// shows what was allocated between the two; with an empty path it does
// nothing. The runtime samples one allocation in about 512 KiB.
func startAllocProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	if err := writeAllocs(path + ".base"); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() { err = writeAllocs(path) })
		return err
	}, nil
}

func writeAllocs(path string) error {
	f, err := os.Create(path) //nolint:gosec // the operator's own --memprofile
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
