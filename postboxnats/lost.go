package postboxnats

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/keyorder"
)

// Deliveries lost on the way (SubscriberConfig.PerKey and Stream).
//
// A delivery the server sent that never reached the Subscriber (the answer
// to a pull, dropped with the connection to a node that failed or was cut
// off from the cluster) stays pending on the server and comes back only
// after AckWait. Meanwhile the later messages of its key would be
// delivered and processed before it. The server numbers the deliveries of
// a consumer (the consumer sequence), so a jump in those numbers says that
// deliveries were lost. First deliveries come in stream order, so the lost
// first deliveries lie after the highest first delivery seen and before
// the one that shows the jump (or, when that one is a redelivery, up to
// the consumer's last delivered message). The Subscriber reads those
// messages from the stream and puts a marker in the line of each key they
// carry, expected within AckWait: those keys wait for the redelivery, as
// behind a retried message, and the others go on. A gap before the Run's
// first new message has no such range (what came before may have been
// acknowledged by an earlier Run): it is logged. Lost redeliveries need
// nothing new: they are of messages the Subscriber holds, or waits for
// already as markers.

const (
	// maxLostScan bounds the stream messages read for one gap, and
	// lostScanTimeout the time spent reading them. A lost pull answer
	// holds at most MaxInFlight deliveries; the rest of a range is
	// other subjects of the stream.
	maxLostScan     = 4 * maxMaxInFlight
	lostScanTimeout = 10 * time.Second
)

// gapWatch is what the puller knows of the consumer's deliveries.
type gapWatch struct {
	last     uint64 // the consumer sequence of the latest delivery
	maxFirst uint64 // the highest stream sequence among first deliveries
	warned   bool   // a gap without a Stream to read was logged
}

// observe notes the delivery md on the puller's goroutine and, when
// deliveries before it were lost, marks their keys.
func (r *run) observe(md *jetstream.MsgMetadata) {
	g := &r.gaps
	dseq, sseq := md.Sequence.Consumer, md.Sequence.Stream
	// A number below the last one is a new consumer leader sending
	// again what it did not know was sent; copies are absorbed.
	var lost uint64
	if g.last != 0 && dseq > g.last+1 {
		lost = dseq - g.last - 1
	}
	g.last = dseq
	first := md.NumDelivered == 1
	if lost == 0 {
		if first {
			g.maxFirst = max(g.maxFirst, sseq)
		}
		return
	}
	if r.s.cfg.Stream == nil {
		if !g.warned {
			g.warned = true
			r.s.log.Warn("postboxnats subscriber: deliveries were lost on the way; their keys' later messages may be processed before them (set SubscriberConfig.Stream to hold those keys)",
				slog.String("consumer", r.s.name), slog.Uint64("lost", lost))
		}
		return
	}
	if g.maxFirst == 0 {
		// No first delivery seen in this Run yet: what came before the
		// gap may have been acknowledged in an earlier one, so no range
		// can be told.
		r.s.log.Warn("postboxnats subscriber: deliveries were lost on the way before the first new message of this Run; their keys' order may break",
			slog.String("consumer", r.s.name), slog.Uint64("lost", lost))
		if first {
			g.maxFirst = sseq
		}
		return
	}
	end := sseq // the lost first deliveries are before end
	if !first {
		ctx, cancel := context.WithTimeout(r.ctx, lostScanTimeout)
		info, err := r.s.cons.Info(ctx)
		cancel()
		if err != nil {
			r.s.log.Warn("postboxnats subscriber: deliveries were lost on the way and the consumer could not be read; their keys' order may break",
				slog.String("consumer", r.s.name), slog.Any("error", err))
			return
		}
		end = info.Delivered.Stream + 1
	}
	r.keys.lost(r.ctx, lost, g.maxFirst, end)
	g.maxFirst = max(g.maxFirst, end-1)
	if first {
		g.maxFirst = max(g.maxFirst, sseq)
	}
}

// lost puts a marker, expected within the longest AckWait, in the line of
// the key of every message after stream sequence after and before end
// that the consumer takes, unless the line has that message already.
func (k *keyOrder) lost(ctx context.Context, lost, after, end uint64) {
	if end <= after+1 {
		return
	}
	s := k.r.s
	from := after + 1
	if end-from > maxLostScan {
		s.log.Warn("postboxnats subscriber: more deliveries were lost than the Subscriber reads back; the order of the keys of the earliest ones may break",
			slog.String("consumer", s.name), slog.Uint64("from_stream_seq", from), slog.Uint64("read_from", end-maxLostScan))
		from = end - maxLostScan
	}
	ctx, cancel := context.WithTimeout(ctx, lostScanTimeout)
	defer cancel()
	type lostMsg struct {
		key string
		seq uint64
	}
	var found []lostMsg
	for seq := from; seq < end; seq++ {
		m, err := s.cfg.Stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted: never redelivered
		}
		if err != nil {
			s.log.Warn("postboxnats subscriber: deliveries were lost on the way and the stream could not be read; their keys' order may break",
				slog.String("consumer", s.name), slog.Uint64("stream_seq", seq), slog.Any("error", err))
			break
		}
		if !s.takes(m.Subject) {
			continue
		}
		if key := header(m.Header, postbox.HeaderPartitionKey); key != "" {
			found = append(found, lostMsg{key, seq})
		}
	}
	now := time.Now()
	marked := 0
	k.mu.Lock()
	for _, f := range found {
		e := &entry{}
		if x := k.keys.Add(f.key, keyorder.Pos{Hi: f.seq}, e); x != e {
			continue
		}
		k.toMarker(e, now, s.ackMax)
		marked++
	}
	k.mu.Unlock()
	s.log.Warn("postboxnats subscriber: deliveries were lost on the way; their keys wait for the server to send them again",
		slog.String("consumer", s.name), slog.Uint64("lost", lost), slog.Uint64("from_stream_seq", from), slog.Uint64("to_stream_seq", end-1),
		slog.Int("keys_held", marked), slog.Duration("within", s.ackMax))
}

// takes reports whether the consumer's filter takes subject.
func (s *Subscriber) takes(subject string) bool {
	if len(s.filters) == 0 {
		return true
	}
	for _, f := range s.filters {
		if subjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether subject matches filter, whose tokens may
// be the wildcards "*" (one token) and ">" (one or more, last).
func subjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, t := range ft {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || t != "*" && t != st[i] {
			return false
		}
	}
	return len(ft) == len(st)
}
