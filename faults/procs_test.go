//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildPostbox builds the postbox binary once, into dir.
func buildPostbox(t *testing.T, dir string) string {
	t.Helper()
	// The binary is a module of its own (cmd/postbox); building from its
	// directory works with the repository's go.work and without it.
	src, err := filepath.Abs("../cmd/postbox")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "postbox")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/postbox: %v\n%s", err, out)
	}
	return bin
}

// buildNATSServer builds the nats-server of the module graph (the one
// the demo embeds), newer than Debian's: the cluster runs need its
// JetStream sync_interval setting.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	src, err := filepath.Abs("../cmd/postbox")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nats-server")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return bin
}

// relayProc is one `postbox relay` process, restarted by its supervisor
// when it exits on its own, and killed, stopped and restarted by faults.
type relayProc struct {
	n    int
	bin  string
	env  []string
	logs string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	expect  bool          // the current process is being ended on purpose
	closing bool
	stopped bool // SIGSTOPped
	starts  int
	exits   []string // unexpected exits
	lives   []*life  // one per start, in order
}

// life is one process of a relay: its relay id (the owner of its leases
// up to the suffix each start adds) and when it started and ended.
type life struct {
	ID      string
	Started time.Time
	Ended   time.Time // zero while it runs
}

func (r *relayProc) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return errors.New("closing")
	}
	f, err := os.OpenFile(r.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "=== harness: start %d at %s\n", r.starts+1, time.Now().Format(time.RFC3339Nano))
	id := fmt.Sprintf("fxr%02ds%d", r.n, r.starts+1)
	cmd := exec.Command(r.bin, "relay")
	cmd.Env = append(append([]string(nil), r.env...), "POSTBOX_RELAY_ID="+id)
	cmd.Stdout, cmd.Stderr = f, f
	// The relay dies with the harness, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.starts++
	r.cmd, r.expect, r.stopped = cmd, false, false
	l := &life{ID: id, Started: time.Now()}
	r.lives = append(r.lives, l)
	done := make(chan struct{})
	r.done = done
	go r.wait(cmd, done, l)
	return nil
}

// wait reaps the process; an exit nobody asked for is recorded and the
// relay started again after a second, as a service manager would.
func (r *relayProc) wait(cmd *exec.Cmd, done chan struct{}, l *life) {
	err := cmd.Wait()
	r.mu.Lock()
	l.Ended = time.Now()
	r.mu.Unlock()
	close(done)
	r.mu.Lock()
	unexpected := !r.expect && !r.closing
	if unexpected {
		r.exits = append(r.exits, fmt.Sprintf("%s: exited on its own: %v", time.Now().Format(time.RFC3339Nano), err))
	}
	r.mu.Unlock()
	if unexpected {
		time.Sleep(time.Second)
		_ = r.start()
	}
}

// signal sends sig to the current process, marking its exit as expected
// when the signal ends it.
func (r *relayProc) signal(sig syscall.Signal) (chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return nil, errors.New("not running")
	}
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM:
		r.expect = true
	case syscall.SIGSTOP:
		r.stopped = true
	case syscall.SIGCONT:
		r.stopped = false
	}
	return r.done, r.cmd.Process.Signal(sig)
}

// kill SIGKILLs the relay and waits until it is gone.
func (r *relayProc) kill() error {
	done, err := r.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	<-done
	return nil
}

// close stops the relay for good: SIGTERM (a clean stop), SIGKILL after
// grace. It reports whether the clean stop finished in time.
func (r *relayProc) close(grace time.Duration) (clean bool) {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	return r.term(grace)
}

// term stops the current process as a deploy does: SIGTERM, SIGKILL
// after grace. It reports whether the clean stop finished in time.
func (r *relayProc) term(grace time.Duration) (clean bool) {
	r.mu.Lock()
	stopped := r.stopped
	r.mu.Unlock()
	if stopped {
		_, _ = r.signal(syscall.SIGCONT)
	}
	done, err := r.signal(syscall.SIGTERM)
	if err != nil {
		return false
	}
	select {
	case <-done:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.cmd.ProcessState != nil && r.cmd.ProcessState.Success()
	case <-time.After(grace):
		_, _ = r.signal(syscall.SIGKILL)
		<-done
		return false
	}
}

// current is the running process's relay id.
func (r *relayProc) current() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lives[len(r.lives)-1].ID
}

// history copies the relay's lives.
func (r *relayProc) history() []life {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]life, len(r.lives))
	for i, l := range r.lives {
		out[i] = *l
	}
	return out
}

func (r *relayProc) stats() (starts int, exits []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, append([]string(nil), r.exits...)
}
