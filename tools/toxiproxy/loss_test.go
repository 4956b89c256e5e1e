package main

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

const rtt = 100 * time.Millisecond

func lossy(p float64) *LossToxic { return &LossToxic{Probability: p, RTT: 100} }

// withDraws makes the loss draws return values in turn (then 1: no loss) for one test.
func withDraws(t *testing.T, values ...float64) {
	t.Helper()
	saved := draw
	draw = func() float64 {
		if len(values) == 0 {
			return 1
		}
		v := values[0]
		values = values[1:]
		return v
	}
	t.Cleanup(func() { draw = saved })
}

// withHolds records every hold Pipe asks for; fire says whether the wait ends (else never).
func withHolds(t *testing.T, fire bool) *[]time.Duration {
	t.Helper()
	saved := after
	var holds []time.Duration
	after = func(d time.Duration) <-chan time.Time {
		holds = append(holds, d)
		c := make(chan time.Time, 1)
		if fire {
			c <- time.Time{}
		}
		return c
	}
	t.Cleanup(func() { after = saved })
	return &holds
}

func TestSegments(t *testing.T) {
	for _, c := range []struct {
		mss     int64
		n, segs int
	}{{0, 0, 0}, {0, 1, 1}, {0, 1448, 1}, {0, 1449, 2}, {0, 32 * 1024, 23}, {100, 250, 3}, {-5, 1449, 2}} {
		got := (&LossToxic{MSS: c.mss}).Segments(c.n)
		if got != c.segs {
			t.Errorf("mss %d, %d bytes: %d segments, want %d", c.mss, c.n, got, c.segs)
		}
	}
}

func TestRepairFollowsRACKAndTheTailLossProbe(t *testing.T) {
	l := lossy(1)
	cases := []struct {
		i, n int
		want time.Duration
	}{
		{0, 1, 2*rtt + 200*time.Millisecond}, // alone in flight: probe after 2 SRTT + RTO_MIN
		{0, 3, rtt + rtt/4},                  // later segments acknowledged: RACK
		{1, 3, rtt + rtt/4},
		{2, 3, 2*rtt + 2*time.Millisecond}, // the tail of several: 2 SRTT + TIMEOUT_MIN
	}
	for _, c := range cases {
		if got := l.Repair(c.i, c.n); got != c.want {
			t.Errorf("segment %d of %d: repair %v, want %v", c.i, c.n, got, c.want)
		}
	}
	if got := (&LossToxic{RTT: -7}).Repair(0, 1); got != 200*time.Millisecond {
		t.Errorf("a negative rtt is taken as 0: got %v", got)
	}
}

func TestHoldIsTheLongestRepairOfTheLostSegments(t *testing.T) {
	withDraws(t, 0.5, 0.0, 0.5) // 3 segments at p = 0.1: only the second is lost
	if got := lossy(0.1).Hold(3 * defaultMSS); got != rtt+rtt/4 {
		t.Errorf("middle segment lost: hold %v, want %v", got, rtt+rtt/4)
	}
	withDraws(t, 0.0, 0.0, 0.0) // all three lost: the tail's repair is the longest
	if got := lossy(0.1).Hold(3 * defaultMSS); got != 2*rtt+2*time.Millisecond {
		t.Errorf("all lost: hold %v, want %v", got, 2*rtt+2*time.Millisecond)
	}
	for _, p := range []float64{0, -1, math.NaN()} {
		withDraws(t, 0, 0, 0)
		if got := lossy(p).Hold(3 * defaultMSS); got != 0 {
			t.Errorf("probability %v: hold %v, want none", p, got)
		}
	}
}

func TestHoldDrawsOncePerSegment(t *testing.T) {
	calls := 0
	saved := draw
	draw = func() float64 { calls++; return 1 }
	defer func() { draw = saved }()
	lossy(0.5).Hold(10 * defaultMSS)
	if calls != 10 {
		t.Errorf("%d draws for 10 segments", calls)
	}
}

// pipe runs the toxic on chunks and returns what came out, in order.
func pipe(t *testing.T, l *LossToxic, chunks [][]byte) []*stream.StreamChunk {
	t.Helper()
	in := make(chan *stream.StreamChunk, len(chunks)+1)
	out := make(chan *stream.StreamChunk, len(chunks)+1)
	stub := toxics.NewToxicStub(in, out)
	start := time.Unix(1000, 0)
	for _, data := range chunks {
		in <- &stream.StreamChunk{Data: data, Timestamp: start}
	}
	in <- nil
	l.Pipe(stub)
	var got []*stream.StreamChunk
	for c := range out { // Pipe closed the stub on the nil chunk: out is closed
		got = append(got, c)
	}
	return got
}

func TestPipeHoldsLostChunksAndKeepsEveryByteInOrder(t *testing.T) {
	holds := withHolds(t, true)
	withDraws(t, 0.0, 0.9, 0.9, 0.0) // chunk 1 (1 segment) lost; chunk 2 (2 segments): none; chunk 3: lost
	chunks := [][]byte{[]byte("a"), bytes.Repeat([]byte("b"), 2000), []byte("c")}
	got := pipe(t, lossy(0.5), chunks)
	if len(got) != 3 {
		t.Fatalf("%d chunks out of 3", len(got))
	}
	for i, c := range got {
		if !bytes.Equal(c.Data, chunks[i]) {
			t.Errorf("chunk %d changed", i)
		}
	}
	want := []time.Duration{2*rtt + 200*time.Millisecond, 2*rtt + 200*time.Millisecond}
	if len(*holds) != 2 || (*holds)[0] != want[0] || (*holds)[1] != want[1] {
		t.Errorf("holds %v, want %v", *holds, want)
	}
	if d := got[0].Timestamp.Sub(time.Unix(1000, 0)); d != want[0] {
		t.Errorf("a held chunk's timestamp moved by %v, want %v", d, want[0])
	}
	if !got[1].Timestamp.Equal(time.Unix(1000, 0)) {
		t.Errorf("a chunk not held had its timestamp moved")
	}
}

func TestPipeWithoutLossNeverWaits(t *testing.T) {
	holds := withHolds(t, true)
	got := pipe(t, lossy(0), [][]byte{[]byte("x"), []byte("y")})
	if len(got) != 2 || len(*holds) != 0 {
		t.Errorf("%d chunks out, %d holds; want 2 and none", len(got), len(*holds))
	}
}

func TestAnInterruptDuringAHoldPassesTheChunkOn(t *testing.T) {
	saved := after
	holding := make(chan struct{})
	after = func(time.Duration) <-chan time.Time { close(holding); return make(chan time.Time) } // never ends
	t.Cleanup(func() { after = saved })
	withDraws(t, 0.0)
	in := make(chan *stream.StreamChunk, 1)
	out := make(chan *stream.StreamChunk, 1)
	stub := toxics.NewToxicStub(in, out)
	in <- &stream.StreamChunk{Data: []byte("kept")}
	done := make(chan struct{})
	go func() { lossy(1).Pipe(stub); close(done) }()
	<-holding
	stub.Interrupt <- struct{}{}
	<-done
	select {
	case c := <-out:
		if string(c.Data) != "kept" {
			t.Errorf("got %q", c.Data)
		}
	default:
		t.Error("the held chunk was lost on interrupt")
	}
}
