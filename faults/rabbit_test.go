//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox/postboxamqp"
)

// rabbitNode is a RabbitMQ node of the run's own, started from the
// machine's packages (POSTBOX_FAULTS_RABBITMQ_SBIN, default
// /usr/lib/rabbitmq/bin) with its own name, ports, data and logs, so that
// the broker faults stop and start it without touching the machine's node.
// As root it runs as the rabbitmq user, whose Erlang cookie rabbitmqctl
// uses.
type rabbitNode struct {
	sbin, base, node string
	port, dist       int
	runAs            *user.User
	proc             child
}

func startRabbit(t *testing.T, ctx context.Context, run string) *rabbitNode {
	t.Helper()
	sbin := os.Getenv("POSTBOX_FAULTS_RABBITMQ_SBIN")
	if sbin == "" {
		sbin = "/usr/lib/rabbitmq/bin"
	}
	if _, err := os.Stat(filepath.Join(sbin, "rabbitmq-server")); err != nil {
		t.Fatalf("rabbitmq-server: %v (set POSTBOX_FAULTS_RABBITMQ_SBIN)", err)
	}
	base, err := os.MkdirTemp("", "postbox-faults-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	n := &rabbitNode{sbin: sbin, base: base, node: "fx" + run + "@localhost"}
	if n.port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	if n.dist, err = freePort(); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if n.runAs, err = user.Lookup("rabbitmq"); err != nil {
			t.Fatalf("running as root needs a rabbitmq user to run the node: %v", err)
		}
	}
	for name, body := range map[string]string{"enabled_plugins": "[].\n", "rabbitmq-env.conf": "", "rabbitmq.conf": ""} {
		if err := os.WriteFile(filepath.Join(base, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.chownAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.stop()
		_ = os.RemoveAll(base)
	})
	if err := n.start(ctx); err != nil {
		t.Fatalf("RabbitMQ node %s: %v", n.node, err)
	}
	return n
}

func (n *rabbitNode) url() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

func (n *rabbitNode) chownAll() error {
	return filepath.Walk(n.base, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return chown(p, n.runAs)
	})
}

func (n *rabbitNode) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(n.sbin, prog), args...)
	cmd.Env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.dist),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.base, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.base, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.base, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.base, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.base, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.base, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	if n.runAs != nil {
		// The rabbitmq user's home holds the Erlang cookie rabbitmqctl uses.
		runAs(cmd, n.runAs, n.base, n.runAs.HomeDir)
	}
	return cmd
}

// start runs the node in the foreground as a child that dies with the
// harness, and waits until it accepts work.
func (n *rabbitNode) start(ctx context.Context) error {
	if _, err := n.proc.launch(n.command(context.WithoutCancel(ctx), "rabbitmq-server"), filepath.Join(n.base, "server.out")); err != nil {
		return err
	}
	if err := waitPort(ctx, n.port, 90*time.Second); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if out, err := n.command(wctx, "rabbitmqctl", "-n", n.node, "await_startup").CombinedOutput(); err != nil {
		return fmt.Errorf("await_startup: %w: %s", err, out)
	}
	return nil
}

// stop stops the node cleanly (rabbitmqctl stop), killing it when that
// does not end it within a minute.
func (n *rabbitNode) stop() error {
	var out []byte
	var err error
	ask := func(*exec.Cmd) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err = n.command(ctx, "rabbitmqctl", "-n", n.node, "stop").CombinedOutput()
	}
	if n.proc.stop(ask, time.Minute) {
		if err != nil {
			return fmt.Errorf("the node did not stop; killed (rabbitmqctl stop: %w: %s)", err, out)
		}
		return errors.New("the node did not stop; killed")
	}
	return nil
}

// rabbitBroker is a RabbitMQ node of the run's own: a topic exchange, the
// consumer's quorum queue and the watcher's, both bound to every key.
type rabbitBroker struct {
	node     *rabbitNode
	exchange string
	queue    string
	watchQ   string
}

func newRabbitBroker(t *testing.T, ctx context.Context, run string) *rabbitBroker {
	t.Helper()
	b := &rabbitBroker{node: startRabbit(t, ctx, run), exchange: "fx" + run, queue: "fx" + run + ".consumer", watchQ: "fx" + run + ".watch"}
	conn, err := amqp.Dial(b.node.url())
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v", b.node.url(), err)
	}
	defer conn.Close()
	for _, q := range []string{b.queue, b.watchQ} {
		if err := postboxamqp.EnsureTopology(ctx, conn, postboxamqp.Topology{Exchange: b.exchange, Queue: q, Bindings: []string{"#"}}); err != nil {
			t.Fatalf("topology: %v", err)
		}
	}
	return b
}

func (b *rabbitBroker) name() string  { return "rabbitmq" }
func (b *rabbitBroker) where() string { return "queue " + b.queue }
func (b *rabbitBroker) addr() string  { return fmt.Sprintf("127.0.0.1:%d", b.node.port) }

func (b *rabbitBroker) relayConfig() string {
	return fmt.Sprintf("amqp:\n  exchange: %q\nroutes:\n  - topics: \"*\"\n    publisher: amqp\n", b.exchange)
}

func (b *rabbitBroker) relayEnv(proxy string) []string {
	return []string{"POSTBOX_AMQP_URL=amqp://guest:guest@" + proxy + "/"}
}

func (b *rabbitBroker) consumerVars() map[string]string {
	return map[string]string{"url": b.node.url(), "queue": b.queue}
}

// watch consumes the watcher's queue, which receives a copy of every
// message the exchange routed, acknowledging each after recording it, and
// reconnects when the node goes away. A redelivery of a copy it already
// recorded (its ack was lost with the connection) is not a new copy.
func (b *rabbitBroker) watch(ctx context.Context, w *watcher) error {
	var seq uint64
	for ctx.Err() == nil {
		err := b.watchOnce(ctx, w, &seq)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			sleep(ctx, 200*time.Millisecond)
		}
	}
	return nil
}

func (b *rabbitBroker) watchOnce(ctx context.Context, w *watcher, seq *uint64) error {
	conn, err := amqp.Dial(b.node.url())
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(500, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, b.watchQ, "fxwatch", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("deliveries closed")
			}
			if !d.Redelivered || !w.has(d.MessageId) {
				*seq++
				s := seen{StreamSeq: *seq, MsgID: d.MessageId, Subject: d.RoutingKey, Stored: time.Now()}
				_ = json.Unmarshal(d.Body, &s.P)
				w.add(s)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
		}
	}
}

// caughtUp: nothing ready in the watcher's queue, and nothing new read
// for a moment (what the watcher holds unacknowledged is being recorded).
func (b *rabbitBroker) caughtUp(ctx context.Context, w *watcher) bool {
	conn, err := amqp.Dial(b.node.url())
	if err != nil {
		return false
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	before := len(w.snapshot())
	q, err := ch.QueueDeclarePassive(b.watchQ, true, false, false, false, nil)
	if err != nil || q.Messages > 0 {
		return false
	}
	sleep(ctx, 300*time.Millisecond)
	return len(w.snapshot()) == before
}

func (b *rabbitBroker) stop() error                     { return b.node.stop() }
func (b *rabbitBroker) start(ctx context.Context) error { return b.node.start(ctx) }
func (b *rabbitBroker) perKeyDelivery() bool            { return false }
