package bucket

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// TestLease: an allotment takes units of a fixed_window bucket's window as charges would, a partial
// grant when less is left, and allotments, charges and peeks share one counter; given-back units
// can be allotted or charged again.
func TestLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	l := lim(key(t, "fw"), algorithm.FixedWindow, 10, time.Hour, 0)

	steps := []struct {
		name      string
		want      int64
		wantUnits int64
		wantRem   int64
	}{
		{"whole slice", 4, 4, 6},
		{"another", 4, 4, 2},
		{"partial", 4, 2, 0},
		{"nothing left", 4, 0, 0},
	}
	var window int64
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			g, err := s.Allot(ctx, l, st.want)
			if err != nil {
				t.Fatal(err)
			}
			if g.Units != st.wantUnits || g.Remaining != st.wantRem {
				t.Errorf("lease of %d: got %d units, %d remaining; want %d, %d", st.want, g.Units, g.Remaining, st.wantUnits, st.wantRem)
			}
			if got, want := g.Window, g.Now.UnixMicro()/time.Hour.Microseconds(); got != want {
				t.Errorf("window: got %d, want %d", got, want)
			}
			if got, want := g.Reset, time.UnixMicro((g.Window+1)*time.Hour.Microseconds()); !got.Equal(want) {
				t.Errorf("reset: got %v, want %v", got, want)
			}
			window = g.Window
		})
	}
	if res := check(t, s, peekReq(l)); res.Allowed || res.Limits[0].Used != 10 {
		t.Errorf("peek after leasing the window: got allowed %v used %d, want denied, used 10", res.Allowed, res.Limits[0].Used)
	}
	given, err := s.GiveBack(ctx, l, window, 3)
	if err != nil || given != 3 {
		t.Fatalf("give back 3: got %d, %v; want 3", given, err)
	}
	if res := check(t, s, one(l, 2)); !res.Allowed || res.Limits[0].Used != 9 {
		t.Errorf("charge of 2 after giving back 3: got allowed %v used %d, want allowed, used 9", res.Allowed, res.Limits[0].Used)
	}
	if g, err := s.Allot(ctx, l, 5); err != nil || g.Units != 1 {
		t.Errorf("lease after the charge: got %+v, %v; want 1 unit", g, err)
	}
	if given, err := s.GiveBack(ctx, l, window-1, 5); err != nil || given != 0 {
		t.Errorf("give back to an ended window: got %d, %v; want 0", given, err)
	}
	if given, err := s.GiveBack(ctx, l, window, 50); err != nil || given != 10 {
		t.Errorf("give back more than counted: got %d, %v; want the 10 counted", given, err)
	}
}

// TestLeaseInvalid: only a valid fixed_window limit and a positive want can be allotted.
func TestLeaseInvalid(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	k := key(t, "k")
	tests := []struct {
		name string
		l    Limit
		want int64
	}{
		{"token bucket", lim(k, algorithm.TokenBucket, 10, time.Second, 0), 1},
		{"no key", lim("", algorithm.FixedWindow, 10, time.Second, 0), 1},
		{"zero want", lim(k, algorithm.FixedWindow, 10, time.Second, 0), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Allot(ctx, tt.l, tt.want); !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("Lease: got %v, want ErrInvalidRequest", err)
			}
		})
	}
	if _, err := s.GiveBack(ctx, lim(k, algorithm.FixedWindow, 10, time.Second, 0), 1, 0); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("GiveBack of 0: got %v, want ErrInvalidRequest", err)
	}
}

// TestLeaseConcurrent: concurrent allotments and charges of one window never grant more than its
// limit between them, and grant all of it.
func TestLeaseConcurrent(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	const limit = 1000
	l := lim(key(t, "fw"), algorithm.FixedWindow, limit, time.Hour, 0)
	var granted atomic.Int64
	windows := sync.Map{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for range 40 {
				if w%4 == 0 {
					res, err := s.Check(ctx, []Request{one(l, 3)})
					if err != nil {
						t.Error(err)
						return
					}
					if res[0].Allowed {
						granted.Add(3)
						windows.Store(res[0].Limits[0].ResetAt.UnixMicro(), true)
					}
					continue
				}
				g, err := s.Allot(ctx, l, 7)
				if err != nil {
					t.Error(err)
					return
				}
				granted.Add(g.Units)
				windows.Store(g.Reset.UnixMicro(), true)
			}
		})
	}
	wg.Wait()
	n := 0
	windows.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Skipf("the hour turned during the test (%d windows)", n)
	}
	// Charges of 3 may leave up to 2 units nobody can take by charge; allotments take what is left.
	if got := granted.Load(); got != limit {
		t.Errorf("granted %d units between leases and charges, want exactly %d", got, limit)
	}
}

// TestLeaseCompactLayout: a fixed_window key in the compact layout (a string n*8 + wid%8
// expiring at its window's end, which --bucket-layout compact writes in the versions that have
// it) is allotted from and given back to in place, its count and layout kept.
func TestLeaseCompactLayout(t *testing.T) {
	t.Parallel()
	_, c := newStore(t)
	s := NewStoreWithConfig(c, StoreConfig{Layout: LayoutCompact})
	t.Cleanup(func() { s.Close() })
	ctx := ctxT(t)
	const w = time.Hour
	l := lim(key(t, "fw"), algorithm.FixedWindow, 10, w, 0)
	srv := serverOf(t, c, l.Key)
	wid := time.Now().UnixMicro() / w.Microseconds()
	if err := srv.Set(ctx, l.Key, 3*8+wid%8, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.PExpireAt(ctx, l.Key, time.UnixMicro((wid+1)*w.Microseconds())).Err(); err != nil {
		t.Fatal(err)
	}
	g, err := s.Allot(ctx, l, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g.Window != wid || g.Units != 5 || g.Remaining != 2 {
		t.Skipf("the hour turned, or: got %+v, want 5 units of window %d, 2 remaining", g, wid) // a turn reads as a new window
	}
	got, err := srv.Get(ctx, l.Key).Int64()
	if err != nil || got != 8*8+wid%8 {
		t.Errorf("compact key after a lease of 5 on 3: got %d, %v; want %d", got, err, 8*8+wid%8)
	}
	if given, err := s.GiveBack(ctx, l, wid, 4); err != nil || given != 4 {
		t.Errorf("give back 4: got %d, %v", given, err)
	}
	// Read directly: this version's check script reads only the previous layout.
	if got, err := srv.Get(ctx, l.Key).Int64(); err != nil || got != 4*8+wid%8 {
		t.Errorf("compact key after giving back 4 of 8: got %d, %v; want %d", got, err, 4*8+wid%8)
	}
	if ttl, err := srv.PTTL(ctx, l.Key).Result(); err != nil || ttl <= 0 {
		t.Errorf("compact key's expiry after a lease and a give-back: %v, %v; want it kept", ttl, err)
	}
}

// TestLeaseCallsNotRetried: an allotment or give-back whose connection closes after the call was
// written may have run, so go-redis must not send it again, even with retries configured: a
// give-back run twice would hand its units out twice. The server counts the calls it reads.
func TestLeaseCallsNotRetried(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	addr := listen(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 1<<16)
		for {
			n, err := c.Read(buf)
			if bytes.Contains(bytes.ToLower(buf[:n]), []byte("evalsha")) {
				calls.Add(1)
				return // read and dropped: it may have run
			}
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("-ERR unknown command\r\n")) // HELLO: go-redis falls back to RESP2
		}
	})
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 3, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()
	s := NewStore(rdb)
	defer s.Close()
	l := lim("{lease}:k", algorithm.FixedWindow, 100, time.Minute, 0)
	for _, tt := range []struct {
		name string
		run  func() error
	}{
		{"lease", func() error { _, err := s.Allot(ctxT(t), l, 10); return err }},
		{"give back", func() error { _, err := s.GiveBack(ctxT(t), l, 1, 10); return err }},
	} {
		calls.Store(0)
		if err := tt.run(); err == nil {
			t.Errorf("%s: no error from a server that closed the connection", tt.name)
		}
		if got := calls.Load(); got != 1 {
			t.Errorf("%s: the server read %d calls, want 1 (never sent again)", tt.name, got)
		}
	}
}
