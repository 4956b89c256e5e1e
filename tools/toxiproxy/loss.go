package main

// The "loss" toxic: what losing a TCP segment on a wide-area path costs a stream that Toxiproxy
// relays. Toxiproxy carries byte streams, so nothing can be dropped inside one; a real network
// drops a segment and the sender's TCP repairs it, which delays that segment and, since TCP
// delivers in order, everything after it on the same connection. This toxic draws each segment's
// loss and holds the chunk for the repair time Linux's TCP would take on a path of the given
// round trip (docs/testbed.md "Loss"):
//
//   - a lost segment with later segments sent behind it (in the same chunk, or a chunk sent soon
//     after) is found lost by RACK once a later one is acknowledged and a quarter of a round trip
//     more has passed since the lost one was sent (RFC 8985 §6.2, reo_wnd = min_RTT / 4): it
//     arrives max(1.25 RTT, gap + RTT) late, gap being how long after it the later one was sent;
//   - a lost tail, with nothing sent behind it in time, is repaired by the tail-loss probe, sent
//     2 smoothed round trips after it, plus Linux's 200 ms minimum RTO when it is the only
//     segment in flight or 2 ms when there are more (tcp_schedule_loss_probe in Linux's
//     net/ipv4/tcp_output.c; RFC 8985 §7.2): it arrives that much late. A segment counts as in
//     flight with it when it was sent less than a round trip before (the chunk before it).
//
// Several losses in one chunk are repaired together: the chunk waits for the longest. Lost
// retransmissions, the congestion window's reaction and a new connection's 1 s initial RTO are
// not modelled. The chunk is held, never dropped or changed: every byte arrives, in order.

import (
	"math/rand"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
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

// after and now are time.After and time.Now; tests replace them to see the holds without waiting.
var (
	after = time.After
	now   = time.Now
)

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

// Lost is what drawing a chunk's segments found: body, the repair of its lost segments that have
// later segments of the chunk behind them (0: none lost), and tail, whether its last one is lost.
type Lost struct {
	Body time.Duration
	Tail bool
}

func (t *LossToxic) rtt() time.Duration { return time.Duration(max(t.RTT, 0)) * time.Millisecond }

// Draw draws each segment of a chunk of size bytes.
func (t *LossToxic) Draw(size int) Lost {
	var l Lost
	p := t.Probability
	if !(p > 0) { // also NaN
		return l
	}
	n := t.Segments(size)
	for i := 0; i < n; i++ {
		if draw() < p {
			if i < n-1 {
				l.Body = t.RackRepair(0)
			} else {
				l.Tail = true
			}
		}
	}
	return l
}

// RackRepair is how late a lost segment arrives when RACK finds it: a later segment, sent gap
// after it, has been acknowledged and 1.25 round trips have passed since the lost one was sent.
func (t *LossToxic) RackRepair(gap time.Duration) time.Duration {
	rtt := t.rtt()
	return max(rtt+rtt/4, max(gap, 0)+rtt)
}

// TailRepair is how late a lost tail arrives when the tail-loss probe repairs it: 2 round trips,
// plus 2 ms if other segments are in flight, else 200 ms.
func (t *LossToxic) TailRepair(inFlight bool) time.Duration {
	if inFlight {
		return 2*t.rtt() + timeoutMin
	}
	return 2*t.rtt() + rtoMin
}

// Pipe passes chunks on in order, holding each one with a lost segment (and so everything behind
// it) for its repair time.
func (t *LossToxic) Pipe(stub *toxics.ToxicStub) {
	var queue []*stream.StreamChunk // read while a chunk was held; passed on after it, in order
	var last time.Time              // when the chunk before was sent
	closing := false                // the stream ended while a chunk was held
	for {
		var c *stream.StreamChunk
		switch {
		case len(queue) > 0:
			c, queue = queue[0], queue[1:]
		case closing:
			stub.Close()
			return
		default:
			select {
			case <-stub.Interrupt:
				return
			case c = <-stub.Input:
				if c == nil {
					stub.Close()
					return
				}
			}
		}
		inFlight := t.Segments(len(c.Data)) > 1 || (!last.IsZero() && c.Timestamp.Sub(last) < t.rtt())
		last = c.Timestamp
		l := t.Draw(len(c.Data))
		hold := l.Body
		if l.Tail {
			hold = max(hold, t.TailRepair(inFlight))
		}
		if hold > 0 {
			held, ok := t.hold(stub, c, l, hold, &queue, &closing)
			if !ok { // an update or removal: pass everything on now, lose no byte
				stub.Output <- c
				for _, q := range queue {
					stub.Output <- q
				}
				return
			}
			c.Timestamp = c.Timestamp.Add(held)
		}
		stub.Output <- c
	}
}

// hold waits out c's repair, reading what arrives meanwhile into queue (at most lossBuffered
// chunks; then the stream waits). When c's tail is lost, the first chunk sent behind it may let
// RACK find the loss before the tail-loss probe would: the hold shrinks to that. It returns how
// long c was held, and false on an interrupt.
func (t *LossToxic) hold(stub *toxics.ToxicStub, c *stream.StreamChunk, l Lost, hold time.Duration,
	queue *[]*stream.StreamChunk, closing *bool) (time.Duration, bool) {
	start := now()
	timer := after(hold)
	input := stub.Input
	behind := false // a chunk sent after c was seen
	for {
		if len(*queue) >= lossBuffered {
			input = nil // a nil channel is never ready: hold the stream back
		}
		select {
		case <-timer:
			return hold, true
		case <-stub.Interrupt:
			return 0, false
		case next := <-input:
			if next == nil {
				*closing, input = true, nil
				continue
			}
			*queue = append(*queue, next)
			if l.Tail && !behind {
				behind = true
				if rack := max(l.Body, t.RackRepair(next.Timestamp.Sub(c.Timestamp))); rack < hold {
					hold = rack
					timer = after(max(hold-now().Sub(start), 0))
				}
			}
		}
	}
}

func init() {
	toxics.Register("loss", new(LossToxic))
}
