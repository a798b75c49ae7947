// Package pgbouncer runs a PgBouncer in front of a PostgreSQL server, on
// loopback, for the tests that show postbox working through a pooler in
// transaction pooling mode. It runs Debian's /usr/sbin/pgbouncer (or the
// binary POSTBOX_PGBOUNCER names), as the postgres user when the caller is
// root, since PgBouncer refuses to run as root.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNotInstalled means no PgBouncer binary was found.
var ErrNotInstalled = errors.New("pgbouncer: not installed (apt-get install pgbouncer, or set POSTBOX_PGBOUNCER)")

// Binary returns the PgBouncer binary's path, or ErrNotInstalled.
func Binary() (string, error) {
	if b := os.Getenv("POSTBOX_PGBOUNCER"); b != "" {
		return b, nil
	}
	if b, err := exec.LookPath("pgbouncer"); err == nil {
		return b, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNotInstalled
}

// Config is what the pooler fronts and how.
type Config struct {
	// Upstream is the PostgreSQL server's host:port.
	Upstream string
	// Databases are the database names clients may ask for; each goes to
	// the database of the same name upstream, as User.
	Databases []string
	// User is the upstream role (default postgres).
	User string
	// Mode is the pool mode: transaction (the default), session or
	// statement.
	Mode string
	// PoolSize is the number of server connections per database (default
	// 20).
	PoolSize int
	// Dir holds the configuration and the log (default a new temporary
	// directory, removed by Stop).
	Dir string
}

// Server is a running PgBouncer.
type Server struct {
	// Port is the loopback port it listens on.
	Port int
	// Log is the path of its log file.
	Log string

	cmd     *exec.Cmd
	done    chan struct{}
	dir     string
	ownDir  bool
	stopped sync.Once
}

// Start starts a PgBouncer and waits until it accepts connections.
func Start(ctx context.Context, c Config) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if c.User == "" {
		c.User = "postgres"
	}
	if c.Mode == "" {
		c.Mode = "transaction"
	}
	if c.PoolSize == 0 {
		c.PoolSize = 20
	}
	host, upPort, err := net.SplitHostPort(c.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream %q: %w", c.Upstream, err)
	}
	s := &Server{dir: c.Dir}
	if s.dir != "" {
		if err := os.MkdirAll(s.dir, 0o750); err != nil {
			return nil, err
		}
	} else {
		if s.dir, err = os.MkdirTemp("", "postbox-pgbouncer-"); err != nil {
			return nil, err
		}
		s.ownDir = true
	}
	runAs, err := serverUser()
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if s.Port, err = freePort(); err != nil {
		s.cleanup()
		return nil, err
	}
	path, err := s.writeConfig(c, host, upPort, runAs)
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.cmd = exec.Command(bin, path) //nolint:gosec // the binary is PgBouncer, found or named by the test environment
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: runAs}
	s.cmd.Dir = s.dir
	out, err := os.Create(filepath.Join(s.dir, "pgbouncer.out"))
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.cmd.Stdout, s.cmd.Stderr = out, out
	if err := s.cmd.Start(); err != nil {
		_ = out.Close()
		s.cleanup()
		return nil, fmt.Errorf("pgbouncer: start: %w", err)
	}
	s.done = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		_ = out.Close()
		close(s.done)
	}()
	if err := s.wait(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// writeConfig writes the pooler's configuration into its directory and
// returns its path.
func (s *Server) writeConfig(c Config, host, upPort string, runAs *syscall.Credential) (string, error) {
	s.Log = filepath.Join(s.dir, "pgbouncer.log")
	var dbs strings.Builder
	for _, db := range c.Databases {
		fmt.Fprintf(&dbs, "%s = host=%s port=%s dbname=%s user=%s\n", db, host, upPort, db, c.User)
	}
	ini := fmt.Sprintf(`[databases]
%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
server_lifetime = 3600
server_idle_timeout = 60
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, dbs.String(), s.Port, c.Mode, c.PoolSize, s.Log, filepath.Join(s.dir, "pgbouncer.pid"))
	path := filepath.Join(s.dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o600); err != nil {
		return "", err
	}
	if runAs != nil {
		for _, p := range []string{s.dir, path} {
			if err := os.Chown(p, int(runAs.Uid), int(runAs.Gid)); err != nil {
				return "", err
			}
		}
	}
	return path, nil
}

// wait returns once the port accepts a connection, or the process ended.
func (s *Server) wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-s.done:
			logged, _ := os.ReadFile(filepath.Join(s.dir, "pgbouncer.out"))
			return fmt.Errorf("pgbouncer exited at start: %s", strings.TrimSpace(string(logged)))
		case <-ctx.Done():
			return fmt.Errorf("pgbouncer: not accepting on %s: %w", addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns databaseURL with its host and port replaced by the pooler's.
func (s *Server) URL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", err
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	return u.String(), nil
}

// Exited reports whether the pooler ended before Stop was called, and if
// so how: its exit status and the end of its output and log, which Stop
// removes with its directory.
func (s *Server) Exited() (string, bool) {
	select {
	case <-s.done:
	default:
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pgbouncer on port %d ended: %v", s.Port, s.cmd.ProcessState)
	for _, name := range []string{"pgbouncer.out", "pgbouncer.log"} {
		text, _ := os.ReadFile(filepath.Join(s.dir, name)) //nolint:gosec // the pooler's own files, in the directory Start made
		lines := strings.Split(strings.TrimSpace(string(text)), "\n")
		fmt.Fprintf(&b, "\n%s, last lines:\n%s", name, strings.Join(lines[max(0, len(lines)-20):], "\n"))
	}
	return b.String(), true
}

// Stop ends the pooler (SIGINT: at once, dropping its connections) and
// removes its directory if Start made it.
func (s *Server) Stop() {
	s.stopped.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
		s.cleanup()
	})
}

func (s *Server) cleanup() {
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// serverUser is the postgres user's credential when running as root
// (PgBouncer refuses root), else nil: the current user.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: running as root needs a postgres user to run it as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
