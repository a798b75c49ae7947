package postboxkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
)

// pollMax bounds the records one poll hands out. Rebalances wait while a
// poll's records are being queued (BlockRebalanceOnPoll), which takes
// microseconds per record.
const pollMax = 1024

// Subscriber consumes Kafka topics as a member of a consumer group and
// hands each record to a postbox.Processor, usually Inbox.Processor. It
// implements postbox.Subscriber. Several Subscribers of one group (in one
// process or many) share the topics' partitions.
//
// Each partition's records are processed one at a time, in offset order,
// and a partition's offset is committed only once its record and every
// earlier one is settled: acknowledged or dead-lettered. See the package
// documentation for retries, rebalances and order.
type Subscriber struct {
	group  string
	topics []string
	cfg    *SubscriberConfig
	opts   []kgo.Opt
	log    *slog.Logger
	// autoWindow: MaxInFlight was left at its default, so a Run takes
	// its Processor's hint (postbox.InFlight).
	autoWindow bool
}

// NewSubscriber returns a Subscriber that consumes topics (Kafka topic
// names) as a member of the consumer group group. opts configure the
// client each Run makes: kgo.SeedBrokers, TLS, SASL, fetch sizes,
// kgo.Balancers, kgo.InstanceID. The Subscriber sets the group, the
// topics and how offsets are committed itself, starts a new group at the
// earliest offset unless opts say otherwise (kgo.ConsumeResetOffset), and
// refuses topic auto-creation, regular-expression topics and direct
// partition assignment. It also sets kgo.FetchMaxWait to 500ms unless opts
// do.
//
// cfg may be nil for all defaults; an invalid one returns a
// *postbox.ConfigError naming every bad field. NewSubscriber connects to
// nothing and creates nothing: topics are topology (EnsureTopic).
func NewSubscriber(group string, topics []string, cfg *SubscriberConfig, opts ...kgo.Opt) (*Subscriber, error) {
	c := cfg.WithDefaults()
	var ps problems
	var ce *postbox.ConfigError
	if errors.As(c.Validate(), &ce) {
		ps = ce.Problems
	}
	if err := validateGroup(group); err != nil {
		ps.Add("group", group, "%v", err)
	}
	if len(topics) == 0 {
		ps.Add("topics", "", "must name at least one topic")
	}
	seen := map[string]bool{}
	for i, t := range topics {
		if err := ValidateTopicName(t); err != nil {
			ps.Add(fmt.Sprintf("topics[%d]", i), t, "%v", err)
		} else if seen[t] {
			ps.Add(fmt.Sprintf("topics[%d]", i), t, "is named twice")
		}
		seen[t] = true
	}
	if err := ps.Err(); err != nil {
		return nil, err
	}
	return &Subscriber{
		group: group, topics: append([]string(nil), topics...), cfg: c,
		opts: append([]kgo.Opt(nil), opts...), log: c.Logger,
		autoWindow: cfg == nil || cfg.MaxInFlight == 0,
	}, nil
}

// Config returns the subscriber's configuration, defaults filled in. A
// Run whose Processor asks for a larger in-flight window than a
// MaxInFlight left at its default holds that many (postbox.InFlight).
func (s *Subscriber) Config() SubscriberConfig { return *s.cfg }

// Group returns the consumer group the Subscriber joins.
func (s *Subscriber) Group() string { return s.group }

// Run joins the group and consumes until ctx ends, then commits what is
// settled, leaves the group and returns nil. It settles each record after
// p.Process returns, as the Verdict says:
//
//   - Ack and DeadLettered: the record is settled; its offset is committed
//     once every earlier record of its partition is, within CommitInterval.
//   - Retry: the partition is held for the Verdict's Delay (at most
//     MaxRetryHold): no later record of it is processed meanwhile, and
//     fetching it pauses once PartitionBuffer records wait. Then the same
//     record is processed again, with Delivery.Delivered one higher.
//
// Run returns an error when its client cannot be made or is configured
// against the Subscriber (see NewSubscriber), when a topic does not exist
// (ErrNoTopic), and when the group or a topic refuses this client's
// credentials before anything was consumed. Lost connections, rebalances
// and other failures are retried by the client while Run goes on.
func (s *Subscriber) Run(ctx context.Context, p postbox.Processor) error {
	if p == nil {
		return errors.New("postboxkafka: Run needs a Processor")
	}
	window := s.cfg.MaxInFlight
	if s.autoWindow {
		window = postbox.InFlight(p, window, maxMaxInFlight)
	}
	r := &run{
		ctx: ctx, p: p, cfg: s.cfg, log: s.log.With(slog.String("group", s.group)),
		sem:   make(chan struct{}, window),
		parts: map[tp]*part{},
		dirty: make(chan struct{}, 1),
		quit:  make(chan struct{}),
	}
	opts := make([]kgo.Opt, 0, len(s.opts)+8)
	// Defaults the caller's options may override: a new group starts at
	// the earliest offset, so nothing published before the group first
	// joined is skipped; and a fetch waits at most 500ms for data (Kafka's
	// own fetch.max.wait.ms), which bounds how long a partition resumed
	// after a full buffer waits for an idle broker's fetch to return.
	opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond))
	opts = append(opts, s.opts...)
	opts = append(opts,
		kgo.ConsumerGroup(s.group),
		kgo.ConsumeTopics(s.topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("postboxkafka: subscriber client: %w", err)
	}
	r.cl = cl
	if err := checkConsumer(cl).Err(); err != nil {
		cl.Close()
		return err
	}
	if err := s.checkTopics(ctx, cl); err != nil || ctx.Err() != nil {
		cl.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.commits.Add(1)
	go r.committer()
	err = r.poll()
	r.shutdown()
	return err
}

// checkTopics returns ErrNoTopic for a topic the cluster says does not
// exist. A lookup that fails otherwise is left to the client, which keeps
// trying as it consumes.
func (s *Subscriber) checkTopics(ctx context.Context, cl *kgo.Client) error {
	for _, t := range s.topics {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.CommitTimeout)
		missing, err := topicMissing(lctx, cl, t)
		cancel()
		if err != nil {
			s.log.Debug("postboxkafka: topic lookup failed", slog.String("topic", t), slog.Any("error", err))
		}
		if missing {
			return fmt.Errorf("postboxkafka: subscribe %s: %w: %s", s.group, ErrNoTopic, t)
		}
	}
	return nil
}

// tp names a topic partition.
type tp struct {
	topic     string
	partition int32
}

// run is one Run: a client, the workers of the partitions it was given,
// and the committer.
type run struct {
	ctx context.Context
	p   postbox.Processor
	cfg *SubscriberConfig
	log *slog.Logger
	cl  *kgo.Client
	sem chan struct{} // MaxInFlight

	// pauseMu serializes the decisions to pause or resume fetching a
	// partition with the calls that carry them out, so the client's state
	// ends as the last decision says.
	pauseMu sync.Mutex
	// commitMu serializes commits: the committer's, and the final ones of
	// revoked partitions and of shutdown. A partition is removed from
	// parts under it, so no commit for it is sent after its revocation
	// returned.
	commitMu sync.Mutex
	// commitFailing is set while commits fail, to log the first failure
	// only. Guarded by commitMu.
	commitFailing bool

	mu    sync.Mutex
	parts map[tp]*part
	// workers counts the partitions' goroutines.
	workers sync.WaitGroup

	dirty   chan struct{} // a settle happened since the last commit
	quit    chan struct{} // closed at shutdown: the committer stops
	commits sync.WaitGroup
}

// poll hands fetched records to their partitions until ctx ends.
func (r *run) poll() error {
	failures, consumed := 0, false
	for {
		fs := r.cl.PollRecords(r.ctx, pollMax)
		if r.ctx.Err() != nil || fs.IsClientClosed() {
			r.cl.AllowRebalance()
			return nil
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = err
			}
			level := slog.LevelWarn
			if failures > 0 {
				level = slog.LevelDebug
			}
			r.log.Log(r.ctx, level, "postboxkafka: fetch failed", slog.String("topic", t), slog.Int("partition", int(p)), slog.Any("error", err))
		})
		n := 0
		fs.EachPartition(func(f kgo.FetchTopicPartition) {
			if len(f.Records) > 0 {
				r.dispatch(tp{f.Topic, f.Partition}, f.Records)
				n += len(f.Records)
			}
		})
		r.cl.AllowRebalance()
		if n > 0 || ferr == nil {
			consumed = consumed || n > 0
			failures = 0
			continue
		}
		if !consumed && refused(ferr) {
			return fmt.Errorf("postboxkafka: consume: %w", ferr)
		}
		failures++
		t := time.NewTimer(min(time.Duration(failures)*100*time.Millisecond, 5*time.Second))
		select {
		case <-t.C:
		case <-r.ctx.Done():
			t.Stop()
		}
	}
}

// refused reports an error that will not mend by itself: the cluster
// refuses this client's credentials or permissions.
func refused(err error) bool {
	for _, e := range []error{kerr.GroupAuthorizationFailed, kerr.TopicAuthorizationFailed,
		kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// dispatch queues records behind their partition, starting its worker
// when it has none. Polls and rebalance callbacks exclude each other
// (BlockRebalanceOnPoll), so records never arrive for a partition whose
// revocation has returned.
func (r *run) dispatch(k tp, recs []*kgo.Record) {
	r.mu.Lock()
	pt := r.parts[k]
	if pt == nil {
		pt = &part{r: r, tp: k, stop: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1), next: -1, committed: -1}
		r.parts[k] = pt
		r.workers.Add(1)
		go pt.work()
	}
	pt.queue = append(pt.queue, recs...)
	r.mu.Unlock()
	pt.signal()
	r.syncPause(pt)
}

// syncPause pauses fetching pt while PartitionBuffer records wait in its
// queue, and resumes it once half of them are processed.
func (r *run) syncPause(pt *part) {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	r.mu.Lock()
	if pt.stopped {
		r.mu.Unlock()
		return // detach resumes it
	}
	n, limit := len(pt.queue), r.cfg.PartitionBuffer
	want := n >= limit || pt.paused && n > limit/2
	change := want != pt.paused
	pt.paused = want
	r.mu.Unlock()
	if !change {
		return
	}
	m := map[string][]int32{pt.tp.topic: {pt.tp.partition}}
	if want {
		r.cl.PauseFetchPartitions(m)
	} else {
		r.cl.ResumeFetchPartitions(m)
	}
}

// detach stops the workers of the partitions in m (all of them when all is
// set) and resumes fetching those that were paused: a partition assigned
// again later starts unpaused. It returns the stopped partitions.
func (r *run) detach(m map[string][]int32, all bool) []*part {
	r.pauseMu.Lock()
	defer r.pauseMu.Unlock()
	var out []*part
	resume := map[string][]int32{}
	r.mu.Lock()
	for _, pt := range r.parts {
		if !all && !contains(m[pt.tp.topic], pt.tp.partition) {
			continue
		}
		if !pt.stopped {
			pt.stopped = true
			close(pt.stop)
		}
		if pt.paused {
			pt.paused = false
			resume[pt.tp.topic] = append(resume[pt.tp.topic], pt.tp.partition)
		}
		out = append(out, pt)
	}
	r.mu.Unlock()
	if len(resume) > 0 {
		r.cl.ResumeFetchPartitions(resume)
	}
	return out
}

func contains(ps []int32, p int32) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// remove forgets parts; the caller holds commitMu.
func (r *run) remove(parts []*part) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pt := range parts {
		if r.parts[pt.tp] == pt {
			delete(r.parts, pt.tp)
		}
	}
}

// revoked runs when the group takes partitions from this member: their
// workers finish the record in hand (a held retry is cut short), then
// what they settled is committed before the partitions go to another
// member, which starts right after it.
func (r *run) revoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	parts := r.detach(m, false)
	wait(parts)
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	_ = r.commit(parts)
	r.remove(parts)
}

// lost runs when this member lost its partitions without a revocation (its
// session expired, it was fenced): another member may own them already,
// so nothing is committed; what was settled and not committed is
// delivered again, and the inbox absorbs it.
func (r *run) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	parts := r.detach(m, false)
	wait(parts)
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	r.remove(parts)
}

func wait(parts []*part) {
	for _, pt := range parts {
		<-pt.done
	}
}

// shutdown stops every worker, commits what they settled and leaves the
// group.
func (r *run) shutdown() {
	parts := r.detach(nil, true)
	r.workers.Wait()
	close(r.quit)
	r.commits.Wait()
	r.commitMu.Lock()
	_ = r.commit(parts)
	r.remove(parts)
	r.commitMu.Unlock()
	// Leaving within CommitTimeout, then closing, keeps a cluster that is
	// gone from holding up the shutdown; the group then drops the member
	// at its session timeout.
	r.cl.AllowRebalance()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CommitTimeout)
	_ = r.cl.LeaveGroupContext(ctx)
	cancel()
	r.cl.Close()
}

var _ postbox.Subscriber = (*Subscriber)(nil)
