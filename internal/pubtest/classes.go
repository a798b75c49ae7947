package pubtest

import (
	"errors"
	"testing"

	"github.com/postbox-go/postbox"
)

// MustMessage fails the test unless err is a message failure
// (postbox.IsMessageError) wrapping target (unless target is nil).
func MustMessage(t testing.TB, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatal("publish succeeded, want a message failure")
	}
	if !postbox.IsMessageError(err) {
		t.Fatalf("got infrastructure failure %v, want a message failure", err)
	}
	if postbox.IsPermanent(err) {
		t.Fatalf("got permanent failure %v, want a message failure that is retried", err)
	}
	mustWrap(t, err, target)
}

// MustPermanent fails the test unless err is a permanent failure
// (postbox.IsPermanent: the relay buries the message at once) wrapping
// target (unless target is nil).
func MustPermanent(t testing.TB, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatal("publish succeeded, want a permanent failure")
	}
	if !postbox.IsPermanent(err) {
		t.Fatalf("got %v (message failure: %v), want a permanent failure", err, postbox.IsMessageError(err))
	}
	mustWrap(t, err, target)
}

// MustInfra fails the test unless err is an infrastructure failure (not
// postbox.IsMessageError) wrapping target (unless target is nil).
func MustInfra(t testing.TB, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatal("publish succeeded, want an infrastructure failure")
	}
	if postbox.IsMessageError(err) {
		t.Fatalf("got message failure %v, want an infrastructure failure", err)
	}
	mustWrap(t, err, target)
}

func mustWrap(t testing.TB, err, target error) {
	t.Helper()
	if target != nil && !errors.Is(err, target) {
		t.Fatalf("got %v, want it to wrap %v", err, target)
	}
}
