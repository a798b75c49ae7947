package testdb

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// SharedService and ExclusiveService order the tests of every package
// around one of the machine's services that some test stops and starts
// again (RabbitMQ, Redis): go test runs packages in parallel processes, so
// a test using the service holds a shared lock until it ends, and the test
// that restarts it holds the lock exclusively. The lock is a file lock in
// the temporary directory, released by the kernel if a test process dies.
func SharedService(t testing.TB, name string) { serviceLock(t, name, syscall.LOCK_SH) }

// ExclusiveService: see SharedService.
func ExclusiveService(t testing.TB, name string) { serviceLock(t, name, syscall.LOCK_EX) }

func serviceLock(t testing.TB, name string, how int) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "postbox-test-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666) //nolint:gosec // a lock file shared by test processes
	if err != nil {
		t.Fatalf("testdb: lock %s: %v", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		t.Fatalf("testdb: lock %s: %v", path, err)
	}
	t.Cleanup(func() { _ = f.Close() })
}
