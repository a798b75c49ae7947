//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The harness runs a broker and a database of its own, real server
// processes from the machine's packages, so that stopping the broker and
// restarting PostgreSQL break nothing but this run.

// freePort asks the kernel for a loopback port nobody listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitPort waits until something accepts connections on 127.0.0.1:port.
func waitPort(ctx context.Context, port int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("port %d did not open within %s: %w", port, limit, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// child is a server process the harness runs in the foreground: it dies
// with the harness however that ends (Pdeathsig), and a stop waits for
// its exit.
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// launch starts cmd, its output appended to logPath when that is set.
func (c *child) launch(cmd *exec.Cmd, logPath string) (done chan struct{}, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var logf *os.File
	if logPath != "" {
		if logf, err = os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
	}
	if err := cmd.Start(); err != nil {
		if logf != nil {
			_ = logf.Close()
		}
		return nil, err
	}
	done = make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		if logf != nil {
			_ = logf.Close()
		}
		close(done)
	}()
	return done, nil
}

// stop asks the process to end with ask (a signal, a control command),
// and kills it when it has not exited after grace. It reports whether it
// had to kill.
func (c *child) stop(ask func(*exec.Cmd), grace time.Duration) (killed bool) {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return false
	}
	ask(cmd)
	select {
	case <-done:
		return false
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
		return true
	}
}

// signal is a stop request by signal.
func signal(sig syscall.Signal) func(*exec.Cmd) {
	return func(cmd *exec.Cmd) { _ = cmd.Process.Signal(sig) }
}

// runAs makes cmd run as u (nil: the current user), in dir, with HOME.
func runAs(cmd *exec.Cmd, u *user.User, dir, home string) {
	if u == nil {
		return
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	cmd.Dir = dir
	cmd.Env = append(cmd.Env, "HOME="+home, "USER="+u.Username, "LOGNAME="+u.Username)
}

// chown gives path to u (nil: nothing to do).
func chown(path string, u *user.User) error {
	if u == nil {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// natsServer is a nats-server process with JetStream and a store of its
// own, which the broker faults stop and start again on the same port and
// store (POSTBOX_FAULTS_NATS_SERVER names the binary; default nats-server
// on PATH or /usr/sbin/nats-server).
type natsServer struct {
	bin, dir, log string
	port          int
	proc          child
	// conf, when set, is a configuration file that says everything
	// (a cluster node's); else flags do.
	conf string
	// gid, when set, is the group the server runs as, the user staying
	// the harness's: a cluster node's, by which a network cut knows its
	// sockets (netcut_test.go).
	gid uint32
}

func startNATS(t *testing.T, ctx context.Context, dir string) *natsServer {
	t.Helper()
	bin := os.Getenv("POSTBOX_FAULTS_NATS_SERVER")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("nats-server"); err != nil {
			bin = "/usr/sbin/nats-server"
		}
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("nats-server binary: %v (set POSTBOX_FAULTS_NATS_SERVER)", err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &natsServer{bin: bin, dir: filepath.Join(dir, "nats"), log: filepath.Join(dir, "nats-server.log"), port: port}
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := s.start(ctx); err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	t.Cleanup(func() { _ = s.stop(10 * time.Second) })
	return s
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *natsServer) start(ctx context.Context) error {
	cmd := exec.Command(s.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir, "-l", s.log)
	if s.conf != "" {
		cmd = exec.Command(s.bin, "-c", s.conf)
	}
	if s.gid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(os.Getuid()), Gid: s.gid, NoSetGroups: true}}
	}
	if _, err := s.proc.launch(cmd, ""); err != nil {
		return err
	}
	return waitPort(ctx, s.port, 20*time.Second)
}

// stop ends the server cleanly (SIGTERM: it flushes its store), with
// SIGKILL after grace.
func (s *natsServer) stop(grace time.Duration) error {
	if s.proc.stop(signal(syscall.SIGTERM), grace) {
		return errors.New("nats-server did not stop on SIGTERM; killed")
	}
	return nil
}

// pgCluster is a PostgreSQL cluster made for the run with the machine's
// binaries (POSTBOX_FAULTS_PG_BINDIR, default the newest
// /usr/lib/postgresql/*/bin), with fsync and synchronous_commit on, which
// the database faults restart: fast (a clean shutdown) or immediate (a
// crash, recovered from the WAL at start). The server runs in the
// foreground as the harness's child, so it dies with the harness however
// that ends. As root it runs as the postgres user, since PostgreSQL
// refuses to run as root.
type pgCluster struct {
	bindir, data, sock, log string
	port                    int
	runAs                   *user.User // nil: the current user
	base                    string     // removed at the end
	proc                    child
}

func startPG(t *testing.T, ctx context.Context) *pgCluster {
	t.Helper()
	bindir := os.Getenv("POSTBOX_FAULTS_PG_BINDIR")
	if bindir == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) < pgMajor(dirs[j]) })
		if len(dirs) == 0 {
			t.Fatal("no PostgreSQL binaries in /usr/lib/postgresql/*/bin (set POSTBOX_FAULTS_PG_BINDIR)")
		}
		bindir = dirs[len(dirs)-1]
	}
	var runAs *user.User
	if os.Geteuid() == 0 {
		var err error
		if runAs, err = user.Lookup("postgres"); err != nil {
			t.Fatalf("running as root needs a postgres user to run the server: %v", err)
		}
	}
	c := newPGCluster(t, bindir, runAs, "postbox-faults-pg-")
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.startFirst(t, ctx)
	return c
}

// newPGCluster lays out a cluster's directories and picks its port; its
// data directory is still to be made (initdb, pg_basebackup). Not under
// the test's temporary directory: that one is private to root, and the
// server runs as postgres.
func newPGCluster(t *testing.T, bindir string, runAs *user.User, pattern string) *pgCluster {
	t.Helper()
	base, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{bindir: bindir, data: filepath.Join(base, "data"), sock: filepath.Join(base, "sock"),
		log: filepath.Join(base, "postgresql.log"), port: port, base: base, runAs: runAs}
	for _, d := range []string{base, c.sock} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := chown(d, c.runAs); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// startFirst starts the cluster for the first time, and has it stopped
// and removed when t ends.
func (c *pgCluster) startFirst(t *testing.T, ctx context.Context) {
	t.Helper()
	t.Cleanup(func() {
		_ = c.stop("immediate")
		_ = os.RemoveAll(c.base)
	})
	if err := c.start(ctx); err != nil {
		t.Fatalf("start PostgreSQL at %s: %v", c.data, err)
	}
}

func pgMajor(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// command makes a command for one of the cluster's programs, as the
// postgres user when the harness runs as root.
func (c *pgCluster) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, prog), args...)
	cmd.Env = os.Environ()
	runAs(cmd, c.runAs, c.base, c.base)
	return cmd
}

// run runs one of the cluster's programs to its end.
func (c *pgCluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	return c.command(ctx, prog, args...).CombinedOutput()
}

// start runs the server and waits until it accepts connections.
func (c *pgCluster) start(ctx context.Context) error {
	cmd := c.command(context.WithoutCancel(ctx), "postgres", "-D", c.data, "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+c.sock, "-c", "max_connections=200",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "shared_buffers=64MB")
	done, err := c.proc.launch(cmd, c.log)
	if err != nil {
		return err
	}
	return waitReady(ctx, done, "postgres", c.log, func() error {
		_, err := c.run(ctx, "pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port))
		return err
	})
}

// waitReady waits until ready succeeds, for at most 90s, or until the
// server, which closes done when it exits, has ended.
func waitReady(ctx context.Context, done <-chan struct{}, name, log string, ready func() error) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited at start (see %s)", name, log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 90s: %w (see %s)", name, err, log)
		}
	}
}

// stop shuts the server down: "fast" (SIGINT: a clean shutdown) or
// "immediate" (SIGQUIT: no checkpoint, recovery from the WAL at the next
// start, as after a crash).
func (c *pgCluster) stop(mode string) error {
	return stopServer(&c.proc, "postgres", mode, syscall.SIGINT, syscall.SIGQUIT)
}

// stopServer stops a database server with fast, or with immediate when
// mode is "immediate", and SIGKILLs it when it has not stopped after a
// minute.
func stopServer(proc *child, name, mode string, fast, immediate syscall.Signal) error {
	sig := fast
	if mode == "immediate" {
		sig = immediate
	}
	if proc.stop(signal(sig), time.Minute) {
		return fmt.Errorf("%s did not stop (%s); killed", name, mode)
	}
	return nil
}

// restart stops the cluster in mode ("fast" or "immediate"), waits hold,
// and starts it again.
func (c *pgCluster) restart(ctx context.Context, mode string, hold time.Duration) error {
	if err := c.stop(mode); err != nil {
		return err
	}
	sleep(ctx, hold)
	return c.start(context.WithoutCancel(ctx))
}

// startReplica makes a streaming replica of primary (pg_basebackup -R:
// standby.signal and primary_conninfo written for it) and starts it on a
// port of its own, with the same settings. It is promoted by a failover.
// It reaches the primary at via (a proxy, which the failover cuts to make
// the replica fall behind).
func startReplica(t *testing.T, ctx context.Context, primary *pgCluster, via string) *pgCluster {
	t.Helper()
	c := newPGCluster(t, primary.bindir, primary.runAs, "postbox-faults-replica-")
	viaHost, viaPort, err := net.SplitHostPort(via)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.run(ctx, "pg_basebackup", "-h", viaHost, "-p", viaPort, "-U", "postgres",
		"-D", c.data, "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	c.startFirst(t, ctx)
	return c
}

// addr is the server's host:port.
func (c *pgCluster) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// crash SIGKILLs the server and every process it started at once, as
// when its machine dies: nothing is flushed, nothing more is sent to a
// replica.
func (c *pgCluster) crash() {
	c.proc.mu.Lock()
	cmd := c.proc.cmd
	c.proc.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pid := cmd.Process.Pid
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	_ = cmd.Process.Kill()
	for _, f := range strings.Fields(string(children)) {
		if n, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	}
	c.proc.stop(func(*exec.Cmd) {}, time.Minute)
}
