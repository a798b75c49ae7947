package postbox

// RelayLanes reports, for c's running relay, how many lanes its share
// calls for, the size of that share, how many partitions it holds, and the
// table's partition count; ok is false when c runs no relay.
func RelayLanes[TTx any](c *Client[TTx]) (lanes, share, held, partitions int, ok bool) {
	run := c.running.Load()
	if run == nil {
		return 0, 0, 0, 0, false
	}
	r := run.r
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.want, len(r.target), len(r.held), r.nparts, true
}

// RelayReading reports how many lanes of c's running relay read now: one
// while its batches come back short; ok is false when c runs no relay.
func RelayReading[TTx any](c *Client[TTx]) (lanes int, ok bool) {
	run := c.running.Load()
	if run == nil {
		return 0, false
	}
	return run.r.activeLanes(), true
}

// RelaySignals reports whether c's running relay listens for change
// signals, and how many it has heard; ok is false when c runs no relay.
func RelaySignals[TTx any](c *Client[TTx]) (listening bool, heard int64, ok bool) {
	run := c.running.Load()
	if run == nil {
		return false, 0, false
	}
	return run.r.listening.Load(), run.r.signals.Load(), true
}

// ClientWoken reports whether c has woken the relay in its process since
// the last call, and whether a wake-up since then was early (sent before
// its rows were committed).
func ClientWoken[TTx any](c *Client[TTx]) (woken, early bool) {
	select {
	case <-c.wake.ch:
		woken = true
	default:
	}
	return woken, c.wake.take().kind == wakeEarly
}
