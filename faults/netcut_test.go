//go:build faults

package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// netCut cuts a cluster node off the network for a while: nothing it
// sends on loopback leaves, and nothing sent to it arrives, on any of its
// connections (its routes to the other nodes, whichever side opened them,
// and its clients'), while the process keeps running. It is an nftables
// table of the run's own, on the output hook of loopback (every packet on
// loopback passes there once, sent by its sender's socket):
//
//   - Each node runs with a group id of its own (root's user id stays), and
//     a standing rule marks every connection one of its sockets sends on
//     with that id (conntrack's mark), from the first packet: a
//     connection the node opened is known by it in both directions.
//   - A cut adds, in a chain of its own, drops of everything the node's
//     sockets send, of every packet of its marked connections, and of
//     every packet to or from its client and cluster ports (connections
//     it accepted, and attempts to open new ones). Lifting it flushes the
//     chain.
//
// Only loopback is touched (oif "lo"), and every drop rule carries its
// own end, a little past the cut's hold (meta time), so that a run killed
// mid-cut leaves no lasting partition behind; a later run deletes the
// tables of runs whose process is gone, and the run's own table is
// deleted when it ends, failed or not. Needs root and nft (Debian's
// nftables).
type netCut struct {
	table string
}

// cutTable names the run's table; the process id in it tells later runs
// whether its owner is still alive.
var cutTable = regexp.MustCompile(`^table inet (pbfx_([0-9]+)_[0-9a-z]+)$`)

// nodeGroup is the group id a cluster node listening on clusterPort runs
// as: the port makes it unique among the runs on the machine.
func nodeGroup(clusterPort int) uint32 { return 1<<20 + uint32(clusterPort) }

// newNetCut makes the run's table, marking the connections of the
// processes of groups; it fails without root or nft.
func newNetCut(ctx context.Context, run string, groups []uint32) (*netCut, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root (nftables)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nft not found: install Debian's nftables: %w", err)
	}
	removeStaleCuts(ctx)
	c := &netCut{table: fmt.Sprintf("pbfx_%d_%s", os.Getpid(), run)}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n  chain cut {\n  }\n  chain out {\n    type filter hook output priority filter; policy accept;\n", c.table)
	for _, g := range groups {
		fmt.Fprintf(&b, "    oif \"lo\" meta skgid %d ct mark set %d\n", g, g)
	}
	b.WriteString("    oif \"lo\" jump cut\n  }\n}\n")
	if err := nft(ctx, b.String()); err != nil {
		return nil, err
	}
	return c, nil
}

// cut isolates the node of group g listening on ports until the returned
// lift is called, and in any case once hold and a margin have passed.
func (c *netCut) cut(ctx context.Context, g uint32, ports []int, hold time.Duration) (lift func() error, err error) {
	// The rule's own end: wall-clock seconds, as the kernel compares.
	end := time.Now().Add(hold + 5*time.Second).Unix()
	var ps []string
	for _, p := range ports {
		ps = append(ps, strconv.Itoa(p))
	}
	set := "{ " + strings.Join(ps, ", ") + " }"
	var b strings.Builder
	for _, match := range []string{
		fmt.Sprintf("meta skgid %d", g),
		fmt.Sprintf("ct mark %d", g),
		"tcp dport " + set,
		"tcp sport " + set,
	} {
		fmt.Fprintf(&b, "add rule inet %s cut meta time < %d %s drop\n", c.table, end, match)
	}
	if err := nft(ctx, b.String()); err != nil {
		_ = c.lift()
		return nil, err
	}
	return c.lift, nil
}

func (c *netCut) lift() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nft(ctx, fmt.Sprintf("flush chain inet %s cut\n", c.table))
}

// close deletes the run's table.
func (c *netCut) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nft(ctx, fmt.Sprintf("delete table inet %s\n", c.table))
}

// removeStaleCuts deletes the tables of runs whose process has ended.
func removeStaleCuts(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "nft", "list", "tables", "inet").Output()
	if err != nil {
		return
	}
	for line := range strings.Lines(string(out)) {
		m := cutTable.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[2])
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = nft(ctx, fmt.Sprintf("delete table inet %s\n", m[1]))
		}
	}
}

// nft runs an nft script, bounded.
func nft(ctx context.Context, script string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}
