package bucket

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// leaseSource is the allotment script; see allot.lua for its contract. It lives beside this file,
// not under lua/, whose files are all parts of the one check script.
//
//go:embed allot.lua
var leaseSource string

// leaseScripts are the allotment script of each Layout: allot.lua after its layout's lines
// (layoutHead), lua/shared.lua and the helpers that uses from the prelude.
var leaseScripts = func() (s [layouts]*script) {
	for l := range layouts {
		s[l] = newScript(layoutHead(l) + "local floor, format = math.floor, string.format\n" +
			mustRead("shared.lua") + leaseSource)
	}
	return s
}()

// Allotment is a slice of a fixed_window bucket's budget taken by Store.Allot: Units were counted
// in the bucket's window Window when Redis's clock read Now, and stay counted until the window
// ends at Reset, whether or not they are ever used.
type Allotment struct {
	// Units is what was granted: the units wanted, or what the window had left when less
	// (0 when nothing).
	Units int64
	// Window is the window's id, floor(Now / window) in µs, for GiveBack.
	Window int64
	// Now is Redis's time of the grant; Reset the end of its window.
	Now, Reset time.Time
	// Remaining is what the window has left after the grant, for every checker.
	Remaining int64
}

// errNotLeasable is a Allotment of a limit whose algorithm cannot be allotted.
var errNotLeasable = errors.New("only fixed_window limits can be leased")

// Allotment takes up to want units of l's current window in one script call (allot.lua): a partial
// grant when the window has less left, counted in the window's counter as an ordinary charge
// of that many units would be. l must be a fixed_window limit. Allotments, charges (Check) and
// peeks of one key share its counter.
//
// The call does not go through the batcher: an allotment is rare (one per slice of many checks),
// and it must not wait behind the checks it is there to spare. An error means the outcome is
// unknown: units may have been granted and are then lost to the window, never admitted twice.
func (s *Store) Allot(ctx context.Context, l Limit, want int64) (Allotment, error) {
	if err := l.validate(); err != nil {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w: %w", l.Key, ErrInvalidRequest, err)
	}
	if l.Algorithm != algorithm.FixedWindow {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w: %w", l.Key, ErrInvalidRequest, errNotLeasable)
	}
	if want < 1 || want > maxValue {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w: %w, got %d", l.Key, ErrInvalidRequest, errCostRange, want)
	}
	arr, err := s.runAllot(ctx, l.Key, "take", l.Limit, l.windowUS(), want, "")
	if err != nil {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w", l.Key, err)
	}
	if len(arr) != 5 {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w", l.Key, ErrMalformedReply)
	}
	var n [5]int64
	for i, s := range arr {
		v, ok := parseInt(s)
		if !ok {
			return Allotment{}, fmt.Errorf("bucket: lease %q: %w", l.Key, ErrMalformedReply)
		}
		n[i] = v
	}
	if n[0] < 0 || n[0] > want {
		return Allotment{}, fmt.Errorf("bucket: lease %q: %w: granted %d of %d", l.Key, ErrMalformedReply, n[0], want)
	}
	return Allotment{Units: n[0], Window: n[1], Now: time.UnixMicro(n[2]), Reset: time.UnixMicro(n[3]), Remaining: n[4]}, nil
}

// GiveBack returns units of a grant of l's window that its checker will not use, so that
// others may allotment them: the window's counter goes down by units (never below 0) when window
// is still the bucket's window, and nothing happens when it has ended, its units gone with
// it. It returns how many units were given back. Giving back units that were used would let
// them be admitted twice: the caller gives back only units it has taken out of use.
func (s *Store) GiveBack(ctx context.Context, l Limit, window, units int64) (int64, error) {
	if err := l.validate(); err != nil {
		return 0, fmt.Errorf("bucket: give back %q: %w: %w", l.Key, ErrInvalidRequest, err)
	}
	if units < 1 || units > maxValue {
		return 0, fmt.Errorf("bucket: give back %q: %w: %w, got %d", l.Key, ErrInvalidRequest, errCostRange, units)
	}
	arr, err := s.runAllot(ctx, l.Key, "give", l.Limit, l.windowUS(), units, strconv.FormatInt(window, 10))
	if err != nil {
		return 0, fmt.Errorf("bucket: give back %q: %w", l.Key, err)
	}
	if len(arr) != 1 {
		return 0, fmt.Errorf("bucket: give back %q: %w", l.Key, ErrMalformedReply)
	}
	given, ok := parseInt(arr[0])
	if !ok {
		return 0, fmt.Errorf("bucket: give back %q: %w", l.Key, ErrMalformedReply)
	}
	return given, nil
}

// runAllot runs allot.lua once on key with args. Like a check's script call (scriptCmd),
// go-redis must never send it again after a failure that may come after it ran: a give-back
// run twice would hand its units out twice. Only a NOSCRIPT reply, which proves it did not
// run, is followed by EVAL, which also caches the script.
func (s *Store) runAllot(ctx context.Context, key string, args ...any) ([]string, error) {
	sc, keys := leaseScripts[s.b.cfg.Layout], []any{1, key}
	if s.hashes > 0 {
		keys = []any{2, key, sharedHash(key, s.hashes)}
	}
	cmd := newScriptCmd(ctx, append(append([]any{"evalsha", sc.sha}, keys...), args...), 1)
	_ = s.rdb.Process(ctx, scriptCmd{cmd})
	if isNoScript(cmd.Err()) {
		cmd = newScriptCmd(ctx, append(append([]any{"eval", sc.src}, keys...), args...), 1)
		_ = s.rdb.Process(ctx, scriptCmd{cmd})
	}
	return cmd.Result()
}
