package main

// The "loss" toxic: what losing a TCP segment on a wide-area path costs a stream that Toxiproxy
// relays. Toxiproxy carries byte streams, so nothing can be dropped inside one; a real network
// drops a segment and the sender's TCP repairs it, which delays that segment and, since TCP
// delivers in order, everything after it on the same connection. This toxic draws each segment's
// loss and holds the chunk for the repair time Linux's TCP would take on a path of the given
// round trip (docs/testbed.md "Loss"):
//
//   - a segment with later segments of the same chunk behind it is found lost by RACK when a
//     later one is acknowledged and a quarter of a round trip more has passed (RFC 8985 §6.2,
//     reo_wnd = min_RTT / 4): the retransmission arrives 1.25 round trips late;
//   - the last segment of a chunk (a tail) is repaired by the tail-loss probe, sent 2 smoothed
//     round trips after it, plus Linux's 200 ms minimum RTO when it is the only segment in flight
//     or 2 ms when there are more (tcp_schedule_loss_probe in Linux's net/ipv4/tcp_output.c;
//     RFC 8985 §7.2): the repair arrives that much late.
//
// Several losses in one chunk are repaired together: the chunk waits for the longest. Lost
// retransmissions, the congestion window's reaction and a new connection's 1 s initial RTO are
// not modelled. The chunk is held, never dropped or changed: every byte arrives, in order.

import (
	"math/rand"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

const (
	defaultMSS   = 1448 // bytes: Ethernet's 1500 less IPv4, TCP and timestamp option headers
	rtoMin       = 200 * time.Millisecond
	timeoutMin   = 2 * time.Millisecond
	lossBuffered = 1024 // chunks, as the latency toxic, so a held chunk does not stall the toxics before it
)

// LossToxic holds a chunk for a TCP repair time when one of its segments is drawn lost.
type LossToxic struct {
	Probability float64 `json:"probability"` // that a segment is lost, 0..1
	RTT         int64   `json:"rtt"`         // the path's round trip, ms
	MSS         int64   `json:"mss"`         // segment size, bytes (0: 1448)
}

// after is time.After; tests replace it to see the holds without waiting for them.
var after = time.After

// draw is rand.Float64; tests replace it to choose which segments are lost.
var draw = rand.Float64

func (t *LossToxic) GetBufferSize() int { return lossBuffered }

// Segments is how many TCP segments carry n bytes.
func (t *LossToxic) Segments(n int) int {
	mss := t.MSS
	if mss <= 0 {
		mss = defaultMSS
	}
	if n <= 0 {
		return 0
	}
	return int((int64(n) + mss - 1) / mss)
}

// Repair is how late segment i (0-based) of a chunk of n segments arrives when it is lost.
func (t *LossToxic) Repair(i, n int) time.Duration {
	rtt := time.Duration(max(t.RTT, 0)) * time.Millisecond
	switch {
	case i < n-1:
		return rtt + rtt/4
	case n == 1:
		return 2*rtt + rtoMin
	default:
		return 2*rtt + timeoutMin
	}
}

// Hold draws each segment of a chunk of size bytes and returns how long the chunk waits: the
// longest repair among its lost segments, 0 if none is lost.
func (t *LossToxic) Hold(size int) time.Duration {
	p := t.Probability
	if !(p > 0) { // also NaN
		return 0
	}
	var hold time.Duration
	n := t.Segments(size)
	for i := 0; i < n; i++ {
		if draw() < p {
			hold = max(hold, t.Repair(i, n))
		}
	}
	return hold
}

func (t *LossToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if hold := t.Hold(len(c.Data)); hold > 0 {
				select {
				case <-after(hold):
					c.Timestamp = c.Timestamp.Add(hold)
				case <-stub.Interrupt:
					stub.Output <- c // an update or removal: pass the chunk on now, lose no byte
					return
				}
			}
			stub.Output <- c
		}
	}
}

func init() {
	toxics.Register("loss", new(LossToxic))
}
