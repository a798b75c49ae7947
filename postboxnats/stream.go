package postboxnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStream creates the stream cfg describes, or updates it to cfg when
// it exists, and returns it. It is the explicit topology step: run it at
// deploy or start-up (every replica may; it is idempotent), never per
// publish. Publish itself creates nothing, and a message whose subject no
// stream captures fails with ErrNoStream.
//
// cfg is sent as given. Two settings decide what a PubAck is worth (see
// the package documentation): Replicas (3 on a cluster, so an ack means a
// quorum stored the message) and Duplicates, the window in which a
// Nats-Msg-Id seen before is acknowledged as a duplicate instead of
// stored again. Make Duplicates at least the relay's redelivery horizon:
// a message whose ack was lost is sent again after the relay's pause, its
// batch deadline, or, when its relay dies, the lease's expiry; with
// postbox's defaults that is under a minute, inside the server's default
// window of two minutes.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if js == nil {
		return nil, errors.New("postboxnats: EnsureStream needs a JetStream")
	}
	if cfg.Name == "" {
		return nil, errors.New("postboxnats: ensure stream: the stream needs a Name")
	}
	if len(cfg.Subjects) == 0 {
		return nil, fmt.Errorf("postboxnats: ensure stream %q: the stream needs Subjects; postbox publishes on subjects", cfg.Name)
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another replica created it between our update and our create,
		// with a config that differs from cfg: update it to ours.
		s, err = js.UpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("postboxnats: ensure stream %q: %w", cfg.Name, err)
	}
	return s, nil
}
