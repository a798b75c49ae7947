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

// proc is one supervised process: a `postbox relay`, or the consumer
// (the test binary run again as consumeChild). It is restarted by its
// supervisor when it exits on its own, and killed, stopped and
// restarted by faults.
type proc struct {
	n    int
	bin  string
	args []string
	env  []string
	logs string
	// idVar names the variable that gives each start its relay id; the
	// consumer has none.
	idVar string
	// crashFile is where a consumer that exits on a crash-looping
	// message wrote its id (consumeChild); empty for a relay.
	crashFile string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	expect  bool          // the current process is being ended on purpose
	closing bool
	stopped bool   // SIGSTOPped
	killing string // the crash-looping message the harness is killing it for
	starts  int
	exits   []string   // unexpected exits
	crashes []crashRec // exits a crash-looping message caused
	lives   []*life    // one per start, in order
}

// crashRec is one process exit a crash-looping message caused, as the
// harness recorded it: the relay it killed for the message's bytes on
// their way to the broker, or the consumer's exit with crashExit.
type crashRec struct {
	ID   string    `json:"id"`
	Proc string    `json:"proc"` // relay<N> or consumer
	Life string    `json:"life"` // the relay id of the process that died, for a relay
	At   time.Time `json:"at"`
	// Delivered is, for the consumer, the delivery count its handler saw
	// (Delivery.Delivered): 1 on what the broker sent as a first delivery.
	Delivered int `json:"delivered,omitempty"`
}

// crashExit is the status of a consumer that met a crash-looping message.
const crashExit = 3

func newRelayProc(n int, bin string, env []string, logs string) *proc {
	return &proc{n: n, bin: bin, args: []string{"relay"}, env: env, logs: logs, idVar: "POSTBOX_RELAY_ID"}
}

// life is one process of a relay: its relay id (the owner of its leases
// up to the suffix each start adds) and when it started and ended.
type life struct {
	ID      string
	Started time.Time
	Ended   time.Time // zero while it runs
}

// name is the process's name in the harness's records.
func (r *proc) name() string {
	if r.idVar == "" {
		return "consumer"
	}
	return fmt.Sprintf("relay%d", r.n)
}

// start starts the process, unless it runs already (a crash's restart
// and a fault's may meet).
func (r *proc) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return errors.New("closing")
	}
	if r.done != nil {
		select {
		case <-r.done:
		default:
			return nil
		}
	}
	f, err := os.OpenFile(r.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "=== harness: start %d at %s\n", r.starts+1, time.Now().Format(time.RFC3339Nano))
	id := fmt.Sprintf("fxr%02ds%d", r.n, r.starts+1)
	cmd := exec.Command(r.bin, r.args...)
	cmd.Env = append([]string(nil), r.env...)
	if r.idVar != "" {
		cmd.Env = append(cmd.Env, r.idVar+"="+id)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// The process dies with the harness, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.starts++
	r.cmd, r.expect, r.stopped, r.killing = cmd, false, false, ""
	l := &life{ID: id, Started: time.Now()}
	r.lives = append(r.lives, l)
	done := make(chan struct{})
	r.done = done
	go r.wait(cmd, done, l)
	return nil
}

// wait reaps the process; an exit nobody asked for is recorded, as a
// crash when a crash-looping message caused it, and the process started
// again after a second, as a service manager would.
func (r *proc) wait(cmd *exec.Cmd, done chan struct{}, l *life) {
	err := cmd.Wait()
	r.mu.Lock()
	l.Ended = time.Now()
	unexpected := !r.expect && !r.closing
	switch crash, delivered := r.crashed(cmd); {
	case crash != "":
		rec := crashRec{ID: crash, Proc: r.name(), At: l.Ended, Delivered: delivered}
		if r.idVar != "" {
			rec.Life = l.ID
		}
		r.crashes = append(r.crashes, rec)
	case unexpected:
		r.exits = append(r.exits, fmt.Sprintf("%s: exited on its own: %v", time.Now().Format(time.RFC3339Nano), err))
	}
	restart := unexpected || r.killing != ""
	r.mu.Unlock()
	close(done)
	if restart && !r.isClosing() {
		time.Sleep(time.Second)
		_ = r.start()
	}
}

// crashed is the crash-looping message that ended cmd, if one did: the
// one the harness killed the relay for, or the one the consumer wrote
// before it exited with crashExit, with the delivery count it wrote
// beside it. r.mu is held.
func (r *proc) crashed(cmd *exec.Cmd) (id string, delivered int) {
	if r.killing != "" {
		return r.killing, 0
	}
	if r.crashFile == "" || cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != crashExit {
		return "", 0
	}
	b, err := os.ReadFile(r.crashFile)
	if err != nil {
		return "unreadable: " + err.Error(), 0
	}
	_ = os.Remove(r.crashFile)
	if _, err := fmt.Sscanf(string(b), "%s %d", &id, &delivered); err != nil {
		return "unreadable: " + string(b), 0
	}
	return id, delivered
}

func (r *proc) isClosing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closing
}

// crashKill ends the relay as a crash-looping message would: SIGKILL, as
// the kernel kills a process out of memory, recorded against id, the
// message whose bytes it was sending. It returns once the process is
// gone; its supervisor starts it again.
func (r *proc) crashKill(id string) {
	r.mu.Lock()
	if r.cmd == nil || r.cmd.Process == nil {
		r.mu.Unlock()
		return
	}
	done := r.done
	select {
	case <-done:
		r.mu.Unlock()
		return
	default:
	}
	if !r.expect {
		r.killing = id
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	r.mu.Unlock()
	<-done
}

// signal sends sig to the current process, marking its exit as expected
// when the signal ends it.
func (r *proc) signal(sig syscall.Signal) (chan struct{}, error) {
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

// kill SIGKILLs the process and waits until it is gone.
func (r *proc) kill() error {
	done, err := r.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	<-done
	return nil
}

// close stops the process for good: SIGTERM (a clean stop), SIGKILL after
// grace. It reports whether the clean stop finished in time.
func (r *proc) close(grace time.Duration) (clean bool) {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	return r.term(grace)
}

// term stops the current process as a deploy does: SIGTERM, SIGKILL
// after grace. It reports whether the clean stop finished in time.
func (r *proc) term(grace time.Duration) (clean bool) {
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
func (r *proc) current() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lives[len(r.lives)-1].ID
}

// history copies the relay's lives.
func (r *proc) history() []life {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]life, len(r.lives))
	for i, l := range r.lives {
		out[i] = *l
	}
	return out
}

func (r *proc) stats() (starts int, exits []string, crashes []crashRec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, append([]string(nil), r.exits...), append([]crashRec(nil), r.crashes...)
}
