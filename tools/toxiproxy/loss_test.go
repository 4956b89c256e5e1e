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
	for _, c := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"tail alone in flight: probe after 2 SRTT + RTO_MIN", l.TailRepair(false), 2*rtt + 200*time.Millisecond},
		{"tail with others in flight: 2 SRTT + TIMEOUT_MIN", l.TailRepair(true), 2*rtt + 2*time.Millisecond},
		{"later segment right behind: RACK's 1.25 RTT", l.RackRepair(0), rtt + rtt/4},
		{"later segment 10 ms behind: still 1.25 RTT", l.RackRepair(10 * time.Millisecond), rtt + rtt/4},
		{"later segment 60 ms behind: its ack, one RTT after it", l.RackRepair(60 * time.Millisecond), 160 * time.Millisecond},
		{"a negative rtt is 0", (&LossToxic{RTT: -7}).TailRepair(false), 200 * time.Millisecond},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestDrawSortsTheLostSegments(t *testing.T) {
	withDraws(t, 0.5, 0.0, 0.5) // 3 segments at p = 0.1: only the second is lost
	if got := lossy(0.1).Draw(3 * defaultMSS); got != (Lost{Body: rtt + rtt/4}) {
		t.Errorf("middle segment lost: %+v", got)
	}
	withDraws(t, 0.5, 0.5, 0.0)
	if got := lossy(0.1).Draw(3 * defaultMSS); got != (Lost{Tail: true}) {
		t.Errorf("last segment lost: %+v", got)
	}
	for _, p := range []float64{0, -1, math.NaN()} {
		withDraws(t, 0, 0, 0)
		if got := lossy(p).Draw(3 * defaultMSS); got != (Lost{}) {
			t.Errorf("probability %v: %+v, want nothing lost", p, got)
		}
	}
}

func TestDrawDrawsOncePerSegment(t *testing.T) {
	calls := 0
	saved := draw
	draw = func() float64 { calls++; return 1 }
	defer func() { draw = saved }()
	lossy(0.5).Draw(10 * defaultMSS)
	if calls != 10 {
		t.Errorf("%d draws for 10 segments", calls)
	}
}

// pipe runs the toxic on chunks and returns what came out, in order.
// Chunk i is sent at 1000 s + i seconds (far apart: none is in flight with another) unless
// sentAt gives its offset.
func pipe(t *testing.T, l *LossToxic, chunks [][]byte, sentAt ...time.Duration) []*stream.StreamChunk {
	t.Helper()
	in := make(chan *stream.StreamChunk, len(chunks)+1)
	out := make(chan *stream.StreamChunk, len(chunks)+1)
	stub := toxics.NewToxicStub(in, out)
	for i, data := range chunks {
		at := time.Duration(i) * time.Second
		if i < len(sentAt) {
			at = sentAt[i]
		}
		in <- &stream.StreamChunk{Data: data, Timestamp: time.Unix(1000, 0).Add(at)}
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
	// (1 s apart: each lost one is alone in flight, and nothing behind it comes in time for RACK)
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
	if !got[1].Timestamp.Equal(time.Unix(1001, 0)) {
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

func TestAChunkSentBehindALostTailLetsRACKRepairItSooner(t *testing.T) {
	// The fake timer never fires on its own: the hold ends only when the toxic asks again for
	// a shorter wait, which it does once it reads the chunk sent 30 ms behind the lost one.
	saved, savedNow := after, now
	var holds []time.Duration
	after = func(d time.Duration) <-chan time.Time {
		holds = append(holds, d)
		c := make(chan time.Time, 1)
		if len(holds) > 1 {
			c <- time.Time{}
		}
		return c
	}
	now = func() time.Time { return time.Unix(5, 0) } // no time passes while held
	t.Cleanup(func() { after, now = saved, savedNow })
	withDraws(t, 0.0, 1.0) // the first chunk's only segment is lost, the second arrives
	got := pipe(t, lossy(0.5), [][]byte{[]byte("lost"), []byte("behind")}, 0, 30*time.Millisecond)
	want := []time.Duration{2*rtt + 200*time.Millisecond, 30*time.Millisecond + rtt}
	if len(holds) != 2 || holds[0] != want[0] || holds[1] != want[1] {
		t.Fatalf("holds %v, want %v (tail-loss probe, then RACK)", holds, want)
	}
	if len(got) != 2 || string(got[0].Data) != "lost" || string(got[1].Data) != "behind" {
		t.Fatalf("out of order or lost: %d chunks", len(got))
	}
	if d := got[0].Timestamp.Sub(time.Unix(1000, 0)); d != want[1] {
		t.Errorf("held for %v, want RACK's %v", d, want[1])
	}
}

func TestALostTailWithAChunkInFlightBeforeItWaitsTheShortProbe(t *testing.T) {
	holds := withHolds(t, true)
	withDraws(t, 1.0, 0.0) // the second chunk, sent 10 ms after the first, is lost
	pipe(t, lossy(0.5), [][]byte{[]byte("first"), []byte("second")}, 0, 10*time.Millisecond)
	if len(*holds) != 1 || (*holds)[0] != 2*rtt+2*time.Millisecond {
		t.Errorf("holds %v, want [%v]", *holds, 2*rtt+2*time.Millisecond)
	}
}

func TestTheEndOfTheStreamDuringAHoldClosesAfterEverythingIsPassedOn(t *testing.T) {
	withHolds(t, true)
	withDraws(t, 0.0)
	got := pipe(t, lossy(0.5), [][]byte{[]byte("a"), []byte("b"), []byte("c")})
	if len(got) != 3 || string(got[2].Data) != "c" {
		t.Errorf("got %d chunks", len(got))
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
