package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox/internal/testdb"
)

// RSSOptions configure the relay memory benchmark.
type RSSOptions struct {
	DatabaseURL string
	NatsURL     string
	// Command starts the relay daemon: the `postbox` binary and "relay".
	// Its configuration is given in POSTBOX_* variables added to the
	// environment; everything else is left at the defaults.
	Command []string
	// Messages is the backlog drained; default 200,000.
	Messages int
	// Keys is the number of distinct ordering keys; default 1,000.
	Keys int
	// Warmup is the idle time before the backlog arrives; default 5s.
	Warmup time.Duration
	// Idle is the time sampled after the drain; default 30s.
	Idle time.Duration
	// Sample is the sampling interval of VmRSS; default 100ms.
	Sample time.Duration
}

// RSSResult is the daemon's memory through the run, in bytes.
type RSSResult struct {
	Messages    int
	StartRSS    int64 // median VmRSS while idle before the backlog
	DrainMaxRSS int64 // the largest VmRSS sampled while draining
	HWM         int64 // VmHWM at the end: the kernel's high-water mark
	// Peak is the larger of HWM and every VmRSS sampled (the kernel
	// updates the high-water mark lazily, so a sample can exceed it).
	Peak      int64
	SteadyRSS int64 // median VmRSS over the last half of the idle phase
	EndRSS    int64 // the last sample
	DrainRate float64
	Samples   []RSSSample
}

// RSSSample is one reading of the daemon's VmRSS.
type RSSSample struct {
	At      time.Duration // since the daemon started
	RSS     int64
	Pending int64
	Phase   string // warmup, drain or idle
}

// Validate checks the options, naming the flag of each bad value.
func (o *RSSOptions) Validate() error {
	var errs []error
	if len(o.Command) == 0 || o.Command[0] == "" {
		errs = append(errs, errors.New("--binary: the postbox binary to run the relay with is required"))
	}
	if o.Messages < 1 || o.Messages > 100_000_000 {
		errs = append(errs, fmt.Errorf("--messages %d: want 1 to 100000000", o.Messages))
	}
	if o.Keys < 0 {
		errs = append(errs, fmt.Errorf("--keys %d: want 0 (keyless) or more", o.Keys))
	}
	if o.Warmup < 0 || o.Warmup > time.Hour {
		errs = append(errs, fmt.Errorf("--warmup %s: want 0 to 1h", o.Warmup))
	}
	if o.Idle < time.Second || o.Idle > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--idle %s: want 1s to 24h", o.Idle))
	}
	if o.Sample < time.Millisecond || o.Sample > time.Minute {
		errs = append(errs, fmt.Errorf("--sample %s: want 1ms to 1m", o.Sample))
	}
	return errors.Join(errs...)
}

func (o *RSSOptions) defaults() {
	defaultURLs(&o.DatabaseURL, testdb.PostgresURL(), &o.NatsURL)
	o.Messages = cmp.Or(o.Messages, 200_000)
	o.Keys = cmp.Or(o.Keys, 1000)
	o.Warmup = cmp.Or(o.Warmup, 5*time.Second)
	o.Idle = cmp.Or(o.Idle, 30*time.Second)
	o.Sample = cmp.Or(o.Sample, 100*time.Millisecond)
}

// RSS runs the real relay daemon as a child process at default settings
// (routing every topic to JetStream), lets it idle, gives it a backlog to
// drain, lets it idle again, and samples its resident memory throughout.
func RSS(ctx context.Context, opts RSSOptions, out io.Writer) (RSSResult, error) {
	opts.defaults()
	res := RSSResult{Messages: opts.Messages}
	if err := opts.Validate(); err != nil {
		return res, err
	}
	tag := randTag()
	bs, err := openStream(ctx, opts.NatsURL, "BENCH_RSS_"+tag, "bench.rss."+tag+".", 0)
	if err != nil {
		return res, err
	}
	defer bs.close(ctx)
	js, stream, subjects := bs.js, bs.name, bs.prefix

	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	prefix := "bench_rss_" + tag + "_"
	_, drop, err := migrated(ctx, pool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	listen, err := freeLoopbackAddr()
	if err != nil {
		return res, err
	}

	cmd := exec.CommandContext(ctx, opts.Command[0], opts.Command[1:]...) //nolint:gosec // the operator names the binary
	cmd.Env = append(os.Environ(),
		"POSTBOX_DATABASE_URL="+opts.DatabaseURL,
		"POSTBOX_PREFIX="+prefix,
		"POSTBOX_NATS_URL="+opts.NatsURL,
		"POSTBOX_NATS_SUBJECT_PREFIX="+subjects,
		"POSTBOX_ADMIN_LISTEN="+listen,
		"POSTBOX_LOG_LEVEL=warn",
	)
	var logs tailBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	fmt.Fprintf(out, "rss: starting %s (admin on %s)\n", strings.Join(opts.Command, " "), listen)
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start the relay: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			return errors.New("the relay did not stop within 20s of SIGTERM")
		}
	}
	defer func() { _ = stop() }()

	pid := cmd.Process.Pid
	sample := func(phase string, pending int64) error {
		rss, _, err := procMemory(pid)
		if err != nil {
			return fmt.Errorf("read the relay's memory: %w (its output: %s)", err, logs.String())
		}
		res.Samples = append(res.Samples, RSSSample{At: time.Since(started), RSS: rss, Pending: pending, Phase: phase})
		return nil
	}
	wait := func() error {
		select {
		case <-time.After(opts.Sample):
			return nil
		case err := <-exited:
			stopped = true
			return fmt.Errorf("the relay exited early (%w); its output:\n%s", err, logs.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	fmt.Fprintf(out, "rss: idle for %s before the backlog\n", opts.Warmup)
	for time.Since(started) < opts.Warmup {
		if err := wait(); err != nil {
			return res, err
		}
		if err := sample("warmup", 0); err != nil {
			return res, err
		}
	}
	fmt.Fprintf(out, "rss: writing a backlog of %d messages\n", opts.Messages)
	// Written while the relay runs, in chunks, as services would.
	var pendingErr error
	written := make(chan struct{})
	go func() {
		defer close(written)
		const chunk = 50_000
		for done := 0; done < opts.Messages; done += chunk {
			if err := fillBacklog(ctx, pool, prefix, min(chunk, opts.Messages-done), max(opts.Keys, 1), opts.Keys == 0); err != nil {
				pendingErr = err
				return
			}
		}
	}()
	drainStart := time.Now()
	lastReport := time.Now()
	for {
		if err := wait(); err != nil {
			return res, err
		}
		pending, err := outboxPending(ctx, pool, prefix)
		if err != nil {
			return res, err
		}
		if err := sample("drain", pending); err != nil {
			return res, err
		}
		if time.Since(lastReport) > 2*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(out, "  %s: %d pending, RSS %.1f MiB\n", time.Since(drainStart).Round(time.Second), pending, mib(res.Samples[len(res.Samples)-1].RSS))
		}
		if pending == 0 && closed(written) {
			if pendingErr != nil {
				return res, fmt.Errorf("write the backlog: %w", pendingErr)
			}
			if n, err := streamMsgs(ctx, js, stream); err != nil {
				return res, err
			} else if n >= uint64(opts.Messages) {
				break
			}
		}
	}
	res.DrainRate = float64(opts.Messages) / time.Since(drainStart).Seconds()
	fmt.Fprintf(out, "rss: drained at %.0f msg/s; idle for %s\n", res.DrainRate, opts.Idle)
	idleStart := time.Now()
	for time.Since(idleStart) < opts.Idle {
		if err := wait(); err != nil {
			return res, err
		}
		if err := sample("idle", 0); err != nil {
			return res, err
		}
	}
	rss, hwm, err := procMemory(pid)
	if err != nil {
		return res, err
	}
	res.HWM, res.EndRSS = hwm, rss
	if err := stop(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return res, err
		}
		return res, fmt.Errorf("the relay exited with %w on SIGTERM; its output:\n%s", err, logs.String())
	}
	n, err := streamMsgs(ctx, js, stream)
	if err != nil {
		return res, err
	}
	if n != uint64(opts.Messages) {
		return res, fmt.Errorf("stream holds %d messages after the drain, want %d", n, opts.Messages)
	}
	var warm, idle []int64
	for _, s := range res.Samples {
		switch s.Phase {
		case "warmup":
			warm = append(warm, s.RSS)
		case "drain":
			res.DrainMaxRSS = max(res.DrainMaxRSS, s.RSS)
		case "idle":
			idle = append(idle, s.RSS)
		}
	}
	res.Peak = max(res.HWM, res.DrainMaxRSS, medianInt(idle), res.EndRSS)
	for _, s := range res.Samples {
		res.Peak = max(res.Peak, s.RSS)
	}
	res.StartRSS = medianInt(warm)
	res.SteadyRSS = medianInt(idle[len(idle)/2:])
	return res, nil
}

// fillBacklog writes n pending rows with 256-byte payloads.
func fillBacklog(ctx context.Context, pool *pgxpool.Pool, prefix string, n, keys int, keyless bool) error {
	key := `'key-' || (i % $2)`
	if keyless {
		key = `CASE WHEN $2::int < 0 THEN 'never' END` // NULL: keyless
	}
	q := `INSERT INTO ` + prefix + `outbox (id, topic, key, payload, headers)
SELECT ` + uuidv7SQL("clock_timestamp()", "i") + `,
  'orders.' || (ARRAY['created','paid','shipped','cancelled'])[1 + i % 4],
  ` + key + `,
  decode(repeat(md5(i::text), 8), 'hex'),
  jsonb_build_object('ce-source', 'bench')
FROM generate_series(1, $1::bigint) AS i`
	_, err := pool.Exec(ctx, q, n, keys)
	return err
}

func streamMsgs(ctx context.Context, js jetstream.JetStream, name string) (uint64, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// procMemory reads VmRSS and VmHWM of pid from /proc, in bytes.
func procMemory(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", name, val, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}

func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func medianInt(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// tailBuffer keeps the last 16 KiB written to it, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 16<<10; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
