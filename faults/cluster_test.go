//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The clustered JetStream's faults (POSTBOX_FAULTS_BROKER=nats-cluster).
const (
	faultNATSLeaderKill = "nats_leader_kill" // SIGKILL the node leading the stream, start it again after Hold
	faultNATSFreeze     = "nats_node_freeze" // SIGSTOP the node leading the stream for Hold, then SIGCONT
	faultNATSCut        = "nats_node_cut"    // cut the node leading the stream off the network (routes and clients) for Hold
)

func init() {
	guarantees[faultNATSLeaderKill] = "G2 G3 G4 G6: the stream's leader dies mid-drain; the two others elect a new one, the relays' unacknowledged publishes are sent again and the stream's duplicate window (replicated with it) or the inbox absorbs them; nothing acknowledged is lost"
	guarantees[faultNATSFreeze] = "G2 G3 G4: the stream's leader stops answering anyone (its routes and its clients) for longer than an election; the others go on without it, and when it wakes it follows them; publishes it held are timed out and sent again"
	guarantees[faultNATSCut] = "G2 G3 G4: the stream's leader is cut off from the other nodes and from its clients while it keeps running; the others elect a leader without it, a publish it cannot replicate is never acknowledged and is sent again, and when the network heals it follows the new leader"
	profiles["cluster"] = profile{
		Name: "cluster", WriteFor: 75 * time.Second, Rounds: 1,
		Mix:     map[string]int{faultNATSLeaderKill: 3, faultNATSFreeze: 1, faultNATSCut: 2, faultKill: 2},
		Writers: 4, Keys: 40, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.01,
		// Deliveries that a killed or cut-off node handed out wait for
		// the consumer's AckWait (30 s) before another node sends them
		// again, after each such fault.
		DrainLimit: 120 * time.Second, Lease: 3 * time.Second, BatchDeadline: time.Second,
	}
}

// natsClusterBroker is three nats-server nodes of the run's own in one
// cluster, with a stream of three replicas. Relays, the consumer and the
// watcher know every node and move to another when theirs fails.
// POSTBOX_FAULTS_NATS_SYNC=always runs the nodes with JetStream's
// sync_interval: always (an fsync before each acknowledgement); the
// default syncs every two minutes and relies on the replicas.
//
// Each node runs with a group id of its own, by which the network cut
// (netcut_test.go) knows its sockets; without root or nft the nodes run as
// the harness does and a scheduled cut fails the run (cutErr).
type natsClusterBroker struct {
	*natsBroker
	nodes  []*natsServer
	names  []string
	cports []int // the nodes' cluster ports
	cut    *netCut
	cutErr error
}

func newNATSClusterBroker(t *testing.T, ctx context.Context, dir, run string, dupWindow time.Duration) *natsClusterBroker {
	t.Helper()
	bin := buildNATSServer(t, dir)
	syncLine := ""
	switch v := os.Getenv("POSTBOX_FAULTS_NATS_SYNC"); v {
	case "", "default":
	case "always":
		syncLine = "sync_interval: always"
	default:
		t.Fatalf("POSTBOX_FAULTS_NATS_SYNC=%q: want always or default", v)
	}
	const n = 3
	ports, cports := make([]int, n), make([]int, n)
	for i := range n {
		var err error
		if ports[i], err = freePort(); err != nil {
			t.Fatal(err)
		}
		if cports[i], err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	b := &natsClusterBroker{cports: cports}
	groups := make([]uint32, n)
	for i := range n {
		groups[i] = nodeGroup(cports[i])
	}
	// Before the nodes start, so that every connection of theirs is
	// marked from its first packet.
	if b.cut, b.cutErr = newNetCut(ctx, run, groups); b.cutErr == nil {
		t.Cleanup(func() {
			if err := b.cut.close(); err != nil {
				t.Errorf("faults: remove the network cut's rules: %v", err)
			}
		})
	} else {
		t.Logf("faults: no network cut of a node in this run: %v", b.cutErr)
	}
	var urls []string
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", cports[j]))
			}
		}
		name := fmt.Sprintf("fx%s-n%d", run, i)
		s := &natsServer{bin: bin, dir: filepath.Join(dir, name), log: filepath.Join(dir, name+".log"), port: ports[i], conf: filepath.Join(dir, name+".conf")}
		if b.cut != nil {
			s.gid = groups[i]
		}
		conf := fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
log_file: %q
jetstream { store_dir: %q
  %s
}
cluster { name: "fx%s", listen: "127.0.0.1:%d", routes: [%s] }
`, name, ports[i], s.log, s.dir, syncLine, run, cports[i], strings.Join(routes, ", "))
		if err := os.MkdirAll(s.dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.start(ctx); err != nil {
			t.Fatalf("nats-server %s: %v", name, err)
		}
		t.Cleanup(func() { _ = s.stop(10 * time.Second) })
		b.nodes = append(b.nodes, s)
		b.names = append(b.names, name)
		urls = append(urls, s.url())
	}
	nb := &natsBroker{stream: "FX" + run, subj: "fx" + run + ".", urls: strings.Join(urls, ",")}
	var err error
	nb.nc, err = nats.Connect(nb.urls, nats.Name("postbox faults harness"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		t.Fatalf("NATS cluster: %v", err)
	}
	t.Cleanup(nb.nc.Close)
	if nb.js, err = jetstream.New(nb.nc); err != nil {
		t.Fatal(err)
	}
	// The cluster needs a moment to elect its meta leader.
	deadline := time.Now().Add(60 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = nb.js.CreateStream(actx, jetstream.StreamConfig{
			Name: nb.stream, Subjects: []string{nb.subj + ">"}, Storage: jetstream.FileStorage,
			Duplicates: dupWindow, MaxAge: 2 * time.Hour, Replicas: n,
		})
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		sleep(ctx, 250*time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create stream %s (R%d): %v", nb.stream, n, err)
	}
	b.natsBroker = nb
	t.Logf("faults: NATS cluster of %d (%s), stream %s with %d replicas, sync_interval %s", n, strings.Join(urls, " "), nb.stream, n, map[bool]string{true: "always", false: "default"}[syncLine != ""])
	return b
}

func (b *natsClusterBroker) name() string { return "nats-cluster" }

// addr is the first node's: the proxy the harness puts there is not
// used, since the relays know every node.
func (b *natsClusterBroker) addr() string { return strings.TrimPrefix(b.nodes[0].url(), "nats://") }

func (b *natsClusterBroker) relayEnv(string) []string {
	urls := make([]string, len(b.nodes))
	for i, s := range b.nodes {
		urls[i] = s.url()
	}
	return []string{"POSTBOX_NATS_URL=" + strings.Join(urls, ",")}
}

// stop and start the whole cluster, one node after another.
func (b *natsClusterBroker) stop() error {
	for _, s := range b.nodes {
		if err := s.stop(10 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

func (b *natsClusterBroker) start(ctx context.Context) error {
	for _, s := range b.nodes {
		if err := s.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// leader is the index of the node leading the stream.
func (b *natsClusterBroker) leader(ctx context.Context) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		i, err := b.leaderOnce(ctx)
		if err == nil {
			return i, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return -1, fmt.Errorf("stream leader: %w", err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// leaderOnce asks once. A request the cluster never answers (no leader
// yet) would wait as long as ctx: each is bounded.
func (b *natsClusterBroker) leaderOnce(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return -1, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1, err
	}
	if info.Cluster != nil {
		for i, name := range b.names {
			if name == info.Cluster.Leader {
				return i, nil
			}
		}
	}
	return -1, fmt.Errorf("no leader yet")
}

// killLeader SIGKILLs the stream's leader and starts it again after
// hold, on its store.
func (b *natsClusterBroker) killLeader(ctx context.Context, hold time.Duration) (string, error) {
	i, err := b.leader(ctx)
	if err != nil {
		return "", err
	}
	b.nodes[i].proc.stop(signal(syscall.SIGKILL), 10*time.Second)
	sleep(ctx, hold)
	return b.names[i], b.nodes[i].start(context.WithoutCancel(ctx))
}

// freezeLeader SIGSTOPs the stream's leader for hold, then SIGCONTs it.
func (b *natsClusterBroker) freezeLeader(ctx context.Context, hold time.Duration) (string, error) {
	i, err := b.leader(ctx)
	if err != nil {
		return "", err
	}
	b.nodes[i].proc.mu.Lock()
	cmd := b.nodes[i].proc.cmd
	b.nodes[i].proc.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return b.names[i], fmt.Errorf("node %s is not running", b.names[i])
	}
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	sleep(ctx, hold)
	return b.names[i], cmd.Process.Signal(syscall.SIGCONT)
}

// cutLeader cuts the stream's leader off the network, its routes and its
// client port, for hold, the process running on.
func (b *natsClusterBroker) cutLeader(ctx context.Context, hold time.Duration) (string, error) {
	if b.cut == nil {
		return "", fmt.Errorf("no network cut: %w", b.cutErr)
	}
	i, err := b.leader(ctx)
	if err != nil {
		return "", err
	}
	lift, err := b.cut.cut(ctx, nodeGroup(b.cports[i]), []int{b.nodes[i].port, b.cports[i]}, hold)
	if err != nil {
		return b.names[i], err
	}
	sleep(ctx, hold)
	return b.names[i], lift()
}

// clusterFault runs one of the cluster's faults.
func (h *harness) clusterFault(ctx context.Context, f *fault) {
	c, ok := h.broker.(*natsClusterBroker)
	if !ok {
		f.Note = "not a NATS cluster run"
		return
	}
	var node string
	var err error
	switch f.Kind {
	case faultNATSLeaderKill:
		node, err = c.killLeader(ctx, f.Hold)
	case faultNATSFreeze:
		node, err = c.freezeLeader(ctx, f.Hold)
	case faultNATSCut:
		node, err = c.cutLeader(ctx, f.Hold)
		if c.cut == nil {
			h.t.Errorf("faults: %s scheduled, but %v", f.Kind, err)
		}
	}
	f.Note = "leader " + node
	if err != nil {
		f.Note += ": " + err.Error()
	}
}
