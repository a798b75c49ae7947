//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	ossignal "os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// The consumer is a process of its own, so that a message can end it: the
// test binary, run again with consumerVar set, which TestMain hands to
// consumeChild instead of running tests. Its supervisor (a proc) starts it
// again after every exit, as a service manager would.
const consumerVar = "POSTBOX_FAULTS_CONSUMER"

// consumerCase is what the consumer process is told, as JSON in
// consumerVar.
type consumerCase struct {
	DB     consumerDB        `json:"db"` // its database (database.consumer)
	Prefix string            `json:"prefix"`
	Broker string            `json:"broker"` // brokerName's
	Vars   map[string]string `json:"vars"`   // the broker's (broker.consumerVars)
	// AckWait is JetStream's (profile.AckWait).
	AckWait time.Duration `json:"ack_wait"`
	// CrashFile is where it writes the id of a crash-looping message and
	// the delivery count its handler saw (Delivery.Delivered) before it
	// exits with crashExit.
	CrashFile string `json:"crash_file"`
}

func TestMain(m *testing.M) {
	if v := os.Getenv(consumerVar); v != "" {
		if err := consumeChild(v); err != nil {
			fmt.Fprintln(os.Stderr, "faults consumer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// consumeChild applies the stream through the inbox until SIGTERM: the
// effect row and the inbox record commit together; poison messages are
// always rejected; a crash-looping message ends the process.
func consumeChild(v string) error {
	var c consumerCase
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		return fmt.Errorf("%s: %w", consumerVar, err)
	}
	ctx, stop := ossignal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := &postbox.Config{
		Prefix: c.Prefix, Logger: log,
		MaxAttempts: 3, MaxCrashes: maxCrashes, BackoffBase: 50 * time.Millisecond, BackoffMax: 250 * time.Millisecond,
	}
	open := openPGConsumer
	if c.DB.Kind == dbMariaDB {
		open = openMariaConsumer
	}
	proc, closeDB, err := open(ctx, c, cfg, applier{crashFile: c.CrashFile})
	if err != nil {
		return err
	}
	defer closeDB()
	sub, closeSub, err := consumerSubscriber(ctx, c.Broker, c.Vars, c.AckWait, log)
	if err != nil {
		return err
	}
	defer closeSub()
	err = sub.Run(ctx, proc)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil // SIGTERM: a clean stop
	}
	return err
}

// applier is the consumer's handler, whatever the database: effect
// inserts a message's effect (id, key, seq) unless it is there already,
// dup records a second application (id), each in the dialect of the
// database (openPGConsumer, openMariaConsumer), run by exec in the
// handler's transaction.
type applier struct {
	crashFile   string
	effect, dup string
}

// execFunc runs a statement in the handler's transaction and counts the
// rows it wrote.
type execFunc func(q string, args ...any) (rows int64, err error)

func (a applier) apply(exec execFunc, d *postbox.Delivery) error {
	var p payload
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		return fmt.Errorf("undecodable payload: %w", err)
	}
	if p.Poison {
		return errPoison
	}
	n, err := exec(a.effect, d.ID, p.Key, p.Seq)
	if err != nil {
		return err
	}
	if p.Crash == crashConsumer {
		// The process ends with the handler's transaction open and its
		// effect written, as after a panic in another goroutine or an
		// out-of-memory kill; first it tells the supervisor why, and
		// with what delivery count.
		if err := writeSynced(a.crashFile, fmt.Sprintf("%s %d", d.ID, d.Delivered)); err != nil {
			fmt.Fprintln(os.Stderr, "faults consumer: crash file:", err)
		}
		os.Exit(crashExit)
	}
	if n == 0 {
		// The inbox let a copy through: record the second application
		// instead of failing, so the checker counts it.
		_, err = exec(a.dup, d.ID)
	}
	return err
}

// writeSynced writes s to path and syncs it.
func writeSynced(path, s string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// newConsumerProc is the consumer's supervised process: this test binary
// again, told c.
func newConsumerProc(t *testing.T, c consumerCase, env []string, logs string) *proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	env = append(append([]string(nil), env...), consumerVar+"="+string(b))
	return &proc{bin: exe, args: []string{"-test.run=^$"}, env: env, logs: logs, crashFile: c.CrashFile}
}
