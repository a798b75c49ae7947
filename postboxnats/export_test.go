package postboxnats

import (
	"github.com/nats-io/nats.go"

	"github.com/postbox-go/postbox"
)

// EncodeMsg returns the NATS message Publish would send for env, or the
// error it would fail env with, without sending anything.
func EncodeMsg(p *Publisher, env *postbox.Envelope) (*nats.Msg, error) {
	f, err := p.flight(env)
	if err != nil {
		return nil, err
	}
	return &f.msg, nil
}
