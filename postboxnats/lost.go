package postboxnats

import (
	"context"
	"errors"
	"log/slog"
	"slices"
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
// behind a retried message, and the others go on. When the stream (or the
// consumer, for the range's end) cannot be read, as while the node that
// leads it is cut off, which keys to hold is not known: every key waits,
// no key starting a message, and the sweep reads again until it can, or
// until a marker's whole wait has passed (the lost deliveries have come
// back by then). A gap before the Run's first new message has no such
// range (what came before may have been acknowledged by an earlier Run):
// it is logged. Lost redeliveries need nothing new: they are of messages
// the Subscriber holds, or waits for already as markers.

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
	// The lost first deliveries are before sseq, or, when this one is a
	// redelivery, up to the consumer's last delivery (end 0: lost asks).
	var end uint64
	if first {
		end = sseq
	}
	if end = r.keys.lost(r.ctx, lost, g.maxFirst, end); end != 0 {
		g.maxFirst = max(g.maxFirst, end-1)
	}
	if first {
		g.maxFirst = max(g.maxFirst, sseq)
	}
}

// gap is a range of stream sequences that lost first deliveries lie in,
// whose messages' keys are still to be read from the stream: the stream
// (or, for end, the consumer) could not be read when the gap was seen.
// While one is left, no key starts a message (keyOrder.next), so that none
// runs before a lost message of its key; the sweep reads it again.
type gap struct {
	lost      uint64 // the deliveries lost, as the consumer's numbers said
	from, end uint64 // [from, end); end 0 until the consumer is read
	since     time.Time
}

// lost puts a marker, expected within the longest AckWait, in the line of
// the key of every message after stream sequence after and before end
// (0: up to the consumer's last delivery, which is asked) that the
// consumer takes, unless the line has that message already. What cannot
// be read now is kept as a gap. It returns end, asked when it was 0 (0
// when the consumer could not be read).
func (k *keyOrder) lost(ctx context.Context, lost, after, end uint64) uint64 {
	if end != 0 && end <= after+1 {
		return end
	}
	g := &gap{lost: lost, from: after + 1, end: end, since: time.Now()}
	if k.read(ctx, g) {
		return g.end
	}
	k.mu.Lock()
	k.gaps = append(k.gaps, g)
	k.mu.Unlock()
	k.r.s.log.Warn("postboxnats subscriber: deliveries were lost on the way and the stream could not be read; every key waits until it can",
		slog.String("consumer", k.r.s.name), slog.Uint64("lost", lost), slog.Uint64("from_stream_seq", g.from), slog.Duration("at_most", k.giveUp))
	return g.end
}

// read reads g's messages and marks their keys; it reports whether it
// read them all. One it could not read is where the next read starts.
func (k *keyOrder) read(ctx context.Context, g *gap) bool {
	s := k.r.s
	ctx, cancel := context.WithTimeout(ctx, lostScanTimeout)
	defer cancel()
	if g.end == 0 {
		info, err := s.cons.Info(ctx)
		if err != nil {
			return false
		}
		g.end = info.Delivered.Stream + 1
		if g.end <= g.from {
			return true
		}
	}
	if g.end-g.from > maxLostScan {
		s.log.Warn("postboxnats subscriber: more deliveries were lost than the Subscriber reads back; the order of the keys of the earliest ones may break",
			slog.String("consumer", s.name), slog.Uint64("from_stream_seq", g.from), slog.Uint64("read_from", g.end-maxLostScan))
		g.from = g.end - maxLostScan
	}
	type lostMsg struct {
		key string
		seq uint64
	}
	var found []lostMsg
	from, done := g.from, true
	for ; g.from < g.end; g.from++ {
		m, err := s.cfg.Stream.GetMsg(ctx, g.from)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted: never redelivered
		}
		if err != nil {
			done = false
			break
		}
		if !s.takes(m.Subject) {
			continue
		}
		if key := header(m.Header, postbox.HeaderPartitionKey); key != "" {
			found = append(found, lostMsg{key, g.from})
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
		k.toMarker(e, now, s.ackMax, lostMarker)
		marked++
	}
	k.mu.Unlock()
	if done {
		s.log.Warn("postboxnats subscriber: deliveries were lost on the way; their keys wait for the server to send them again",
			slog.String("consumer", s.name), slog.Uint64("lost", g.lost), slog.Uint64("from_stream_seq", from), slog.Uint64("to_stream_seq", g.end-1),
			slog.Int("keys_held", marked), slog.Duration("within", s.ackMax))
	}
	return done
}

// readGaps reads the gaps left again. One left longer than a marker's
// whole wait is given up: its lost deliveries have come back by then, or
// will not, and the keys go on.
func (k *keyOrder) readGaps(now time.Time) {
	k.mu.Lock()
	gaps := slices.Clone(k.gaps)
	k.mu.Unlock()
	var settled []*gap
	for _, g := range gaps {
		switch {
		case now.Sub(g.since) > k.giveUp:
			k.r.s.log.Warn("postboxnats subscriber: the stream could not be read for lost deliveries in time; their keys' order may break",
				slog.String("consumer", k.r.s.name), slog.Uint64("lost", g.lost), slog.Uint64("from_stream_seq", g.from))
			settled = append(settled, g)
		case k.read(k.r.ctx, g):
			settled = append(settled, g)
		}
	}
	k.mu.Lock()
	k.gaps = slices.DeleteFunc(k.gaps, func(g *gap) bool { return slices.Contains(settled, g) })
	k.mu.Unlock()
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
