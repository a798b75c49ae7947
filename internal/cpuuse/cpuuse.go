// Package cpuuse measures the CPU time this process and the servers beside
// it (the database's, the broker's) used during a phase of a benchmark,
// per message, from /proc.
package cpuuse

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ),
// 100 per second on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// proc is one process's CPU time so far, and its name.
type proc struct {
	name string
	cpu  time.Duration
}

// times is the CPU time (user + system, with waited-for children) used
// so far by this process (under the name "self") and by every process
// whose name is in names, by pid. It is nil where /proc is not there: the
// figures built on it are then left out.
func times(names ...string) map[int]proc {
	return timesAt("/proc", os.Getpid(), names...)
}

// timesAt is times over the proc file system at root, with self the
// pid of this process.
func timesAt(root string, self int, names ...string) map[int]proc {
	t, ok := procCPU(filepath.Join(root, strconv.Itoa(self), "stat"))
	if !ok {
		return nil
	}
	out := map[int]proc{self: {"self", t}}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	paths, _ := filepath.Glob(filepath.Join(root, "[0-9]*", "stat"))
	for _, p := range paths {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == self {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(filepath.Dir(p), "comm"))
		if err != nil {
			continue
		}
		name := string(bytes.TrimSpace(comm))
		if !want[name] {
			continue
		}
		if t, ok := procCPU(p); ok {
			out[pid] = proc{name, t}
		}
	}
	return out
}

// procCPU reads utime, stime, cutime and cstime (fields 14 to 17) of a
// /proc/<pid>/stat file. The command name (field 2) may hold spaces and
// parentheses, so the fields are counted from its closing parenthesis.
func procCPU(path string) (time.Duration, bool) {
	b, err := os.ReadFile(path) //nolint:gosec // a /proc stat file
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); fields 14–17 are f[11]..f[14].
	if len(f) < 15 {
		return 0, false
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, true
}

// Use is the CPU time each side used during a phase, per message.
type Use struct {
	Self time.Duration // this process: the benchmark's client, or the relay
	// Database is every process of the database server: those named
	// postgres, or mariadbd and mysqld (Phase's names).
	Database time.Duration
	// Broker is every process of the broker's server: nats-server, or
	// RabbitMQ's beam.smp (PhaseOf's broker).
	Broker time.Duration
}

// Total is the sum of the three.
func (c Use) Total() time.Duration { return c.Self + c.Database + c.Broker }

// Phase measures the CPU used between its call and the call of the
// function it returns, divided by messages. A process that ends during
// the phase loses its share; one that starts counts whole. The database
// server is every process named in db, PostgreSQL's "postgres" when db is
// empty. The figure is only as good as the machine is otherwise quiet:
// other work's database backends count too.
func Phase(db ...string) func(messages int) (Use, bool) {
	return PhaseOf("nats-server", db...)
}

// PhaseOf is Phase with the broker's server named broker.
func PhaseOf(broker string, db ...string) func(messages int) (Use, bool) {
	if len(db) == 0 {
		db = []string{"postgres"}
	}
	names := append([]string{broker}, db...)
	before := times(names...)
	return func(messages int) (Use, bool) {
		return between(before, times(names...), messages, broker)
	}
}

// between is the CPU each side used from before to after, per message:
// this process's, the broker's (the processes named broker), and every
// other process's read as the database's. A pid found under another name
// after is a reused one and counts whole.
func between(before, after map[int]proc, messages int, broker string) (Use, bool) {
	if before == nil || after == nil || messages <= 0 {
		return Use{}, false
	}
	sum := map[string]time.Duration{}
	for pid, a := range after {
		b := before[pid]
		if b.name != "" && b.name != a.name {
			b.cpu = 0
		}
		if d := a.cpu - b.cpu; d > 0 {
			sum[a.name] += d
		}
	}
	n := time.Duration(messages)
	var db time.Duration
	for name, d := range sum {
		if name != "self" && name != broker {
			db += d
		}
	}
	return Use{Self: sum["self"] / n, Database: db / n, Broker: sum[broker] / n}, true
}
