package postboxidem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Sentinel errors of the clean-up loop.
var (
	// ErrStarted is returned by Start when the loop is already running.
	ErrStarted = errors.New("postboxidem: clean-up already started")
	// ErrNotStarted is returned by Stop when the loop is not running.
	ErrNotStarted = errors.New("postboxidem: clean-up not started")
)

// Cleanup deletes expired records, CleanupBatch at a time, until none are
// left or ctx ends, and returns how many it deleted. Each batch is one
// short statement, so a large backlog never holds a long transaction.
// Claims still held are never deleted. Replicas may run it at once: on
// PostgreSQL each batch skips the rows another one has locked.
func (m *Middleware[TTx]) Cleanup(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := m.store.PruneIdempotency(ctx, m.cfg.CleanupBatch)
		total += n
		if err != nil {
			return total, m.wrap("clean up", err)
		}
		if n < m.cfg.CleanupBatch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

type cleanupLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs Cleanup at once and then every CleanupInterval, in one
// goroutine, until Stop. One replica running it is enough; more do no
// harm.
func (m *Middleware[TTx]) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &cleanupLoop{cancel: cancel, done: make(chan struct{})}
	m.running = l
	go func() {
		defer close(l.done)
		t := time.NewTicker(m.cfg.CleanupInterval)
		defer t.Stop()
		for {
			if n, err := m.Cleanup(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("postboxidem: clean-up pass failed", slog.Int("deleted", n), slog.Any("error", err))
			} else if n > 0 {
				m.log.Info("postboxidem: clean-up pass", slog.Int("deleted", n))
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}

// Stop ends the clean-up loop, waiting for a pass in progress until ctx
// ends; the pass is cancelled either way.
func (m *Middleware[TTx]) Stop(ctx context.Context) error {
	m.mu.Lock()
	l := m.running
	m.running = nil
	m.mu.Unlock()
	if l == nil {
		return ErrNotStarted
	}
	l.cancel()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
