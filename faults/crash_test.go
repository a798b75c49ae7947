//go:build faults

package faults

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/tcpproxy"
)

// The crash-looping messages. A message of crash_relay kills every relay
// that publishes it; one of crash_consumer kills the consumer whenever its
// handler runs. Both must end as dead messages after a bounded number of
// deaths (maxCrashes, as design §4 and §5 count them), their keys moving
// on, the other keys flowing.
//
// The relays are the shipped `postbox relay` binary, which has no way to
// be told to die on a payload, and must not get one. The harness ends
// them as the kernel ends a process out of memory: each relay reaches the
// broker through a proxy of its own, which shows the relay's bytes to
// crashInspector before it forwards them; when they hold a crash_relay
// payload, the relay is SIGKILLed while that publish is in flight, and
// the bytes never reach the broker. (Building a relay main of the
// harness's own around the daemon is not open: the daemon's package is
// internal to cmd/postbox. Wrapping the publisher in the library, as the
// driver suite's crash tests do, would test a relay other than the
// shipped one.) The consumer is a process of the harness's own
// (consumeChild), whose handler exits on its payload.
//
// The kills and exits are counted from the harness's own records (the
// supervisor's, per process), never from the database's counters.

// maxCrashes is the relays' relay.max_crashes and the consumer's
// Config.MaxCrashes.
const maxCrashes = postbox.DefaultMaxCrashes

// The most process deaths one crash-looping message may cause. The relay:
// one publishing it in a batch with no crash marks (its partition was
// not taken after an expiry), one publishing it marked with others, and
// maxCrashes publishing it alone (design §4, "A message that kills the
// relay"); and one more for each death of a relay that had given up its
// crash marks because the database did not take them in time, which it
// says in its log (giveUps): that takeover publishes without marks, and
// its crash goes uncounted. The consumer: the first delivery's run, which
// counts nothing, and maxCrashes redeliveries' (design §5); and one more
// for each run of what the broker sent again as a first delivery.
//
// Those runs: the inbox counts a run only on a redelivery, as the
// broker's count tells it, so a broker that sends a message it delivered
// before with the count of a first delivery makes that run uncounted.
// nats-server before 2.10.14 does so after a consumer's process dies
// (nats-server#5305: a failed delivery from the redelivery queue moved
// the consumer's next sequence back, and the message there went out again
// as new), Debian 12's 2.9.10 among them. The consumer writes the count
// its handler saw beside the message's id (crashFile), so those runs are
// told from the harness's own records: every death on a count of 1 after
// the first.
const (
	relayCrashBound    = maxCrashes + 2
	consumerCrashBound = maxCrashes + 1
)

// relayCrashPayload finds a crash_relay payload in what a relay sends and
// its message id: payload's JSON, whose last field is the marker.
var relayCrashPayload = regexp.MustCompile(`\{"id":"([0-9a-f-]{36})"[^{}]*,"crash":"` + crashRelay + `"\}`)

// crashTail is how much of one chunk the inspector keeps for the next:
// more than a whole payload, so that one split across two chunks is found
// in the second, before its end is forwarded.
const crashTail = 1024

// crashInspector watches one connection of relay r to the broker: when it
// carries a crash_relay payload, r is killed before the chunk goes on.
func crashInspector(r *proc) tcpproxy.Inspector {
	var tail []byte
	return func(b []byte) bool {
		buf := append(tail, b...)
		if m := relayCrashPayload.FindSubmatch(buf); m != nil {
			r.crashKill(string(m[1]))
			return false
		}
		tail = append([]byte(nil), buf[max(0, len(buf)-crashTail):]...)
		return true
	}
}

// giveUpLine is what a relay logs when it publishes a batch without crash
// marks, and its time and relay id.
var giveUpLine = regexp.MustCompile(`^time=(\S+) .*msg="postbox relay publishes a batch without crash marks.* relay=(fxr\d+s\d+)-`)

// giveUps reads the relays' logs: for each relay life (fxr<N>s<start>),
// when it gave up crash marks.
func giveUps(paths []string) (map[string][]time.Time, error) {
	out := map[string][]time.Time{}
	err := eachLogLine(paths, func(line string) {
		if !strings.Contains(line, "without crash marks") {
			return
		}
		if m := giveUpLine.FindStringSubmatch(line); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				out[m[2]] = append(out[m[2]], at)
			}
		}
	})
	return out, err
}

// eachLogLine calls fn with each line of the logs at paths, in order.
func eachLogLine(paths []string, fn func(line string)) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fn(sc.Text())
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
