package bucket

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A balance's journal closes the one window in which a burn could escape the ledger: Redis has
// charged, and the decision that reports the charge is not yet durable (the checker killed,
// or the script's answer lost on the way back). The script that burns writes, in the same run,
// what it did into the balance's journal (lua/balance.lua: a hash beside the balance, one field
// per decision id); the checker deletes the field once the decision is durable (TrimJournal).
// A field that outlives that (OldJournal) is a decision that may be lost: its moves are
// published again under the same decision id, and the ledger counts one decision's moves once
// (docs/entitlements.md), so that a decision published twice, once by its checker and once
// from the journal, counts once, and one never published counts all the same.

// journalSuffix makes a balance's key its journal's: the same hash tag, so the same slot.
const journalSuffix = "#j"

// journalMatch finds the journals among the keys (a balance's key is rl:{tag}:bl:<entitlement>).
const journalMatch = "rl:*:bl:*" + journalSuffix

// JournalArg is a Limit.Journal (and Settle's and UseBalance's journal argument): id, the id of
// the decision that will report what the charge does, and holder, the balance's holder as the
// caller names it, which the journal hands back (JournalEntry.Holder). id holds no '|'.
func JournalArg(id, holder string) string { return id + "|" + holder }

// JournalRef names one entry of a balance's journal.
type JournalRef struct {
	Key string // the balance's key
	ID  string // the decision's id
}

// JournalEntry is what one decision did to a balance, as its charge, use or settle journaled it.
type JournalEntry struct {
	JournalRef
	// Holder is the holder as JournalArg was given it ("" for a settle's).
	Holder string
	// At is Redis's time of the charge.
	At time.Time
	// PeriodStart and PeriodEnd are the balance's period the moves were made in.
	PeriodStart, PeriodEnd time.Time
	// Told are the thresholds the charge told; Moves what it did to the grants.
	Told  []Told
	Moves []Move
}

// TrimJournal deletes the entries refs, whose decisions are durable, in one pipeline. An entry
// already gone is no error.
func (s *Store) TrimJournal(ctx context.Context, refs []JournalRef) error {
	if len(refs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, r := range refs {
		pipe.HDel(ctx, r.Key+journalSuffix, r.ID)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bucket: trim %d journal entries: %w", len(refs), err)
	}
	return nil
}

// OldJournal calls fn with the journal entries charged more than age ago by Redis's clock, a
// page at a time (the entries of up to 100 journals), scanning every journal (on a cluster,
// every master's). An error of fn ends the scan and is returned. It reads only: fn deletes
// what it made durable (TrimJournal).
func (s *Store) OldJournal(ctx context.Context, age time.Duration, fn func([]JournalEntry) error) error {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("bucket: journal: redis time: %w", err)
	}
	before := now.Add(s.b.cfg.ClockOffset).Add(-age)
	scan := func(ctx context.Context, c redis.Cmdable) error { return s.scanJournals(ctx, c, before, fn) }
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	}
	return scan(ctx, s.rdb)
}

// scanJournals scans the journals of one server, calling fn with the entries charged before.
func (s *Store) scanJournals(ctx context.Context, c redis.Cmdable, before time.Time, fn func([]JournalEntry) error) error {
	var cursor uint64
	for {
		keys, next, err := c.ScanType(ctx, cursor, journalMatch, 100, "hash").Result()
		if err != nil {
			return fmt.Errorf("bucket: journal: scan: %w", err)
		}
		var page []JournalEntry
		for _, k := range keys {
			fields, err := c.HGetAll(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("bucket: journal: read %q: %w", k, err)
			}
			key := strings.TrimSuffix(k, journalSuffix)
			for id, v := range fields {
				e, ok := parseJournal(key, id, v)
				if ok && e.At.Before(before) {
					page = append(page, e)
				}
			}
		}
		if len(page) > 0 {
			if err := fn(page); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// parseJournal reads the entry id of the balance at key: "<k>,<at µs>,<period start s>,<period
// end µs>|<burned>|<told>|<moves>|<holder>" (lua/balance.lua). A malformed entry (none is
// written) is skipped.
func parseJournal(key, id, v string) (JournalEntry, bool) {
	parts := strings.SplitN(v, "|", 5)
	if len(parts) != 5 {
		return JournalEntry{}, false
	}
	head := strings.Split(parts[0], ",")
	if len(head) != 4 || (head[0] != "c" && head[0] != "g") {
		return JournalEntry{}, false
	}
	var n [3]int64
	for i := range n {
		var err error
		if n[i], err = strconv.ParseInt(head[i+1], 10, 64); err != nil {
			return JournalEntry{}, false
		}
	}
	return JournalEntry{
		JournalRef:  JournalRef{Key: key, ID: id},
		Holder:      parts[4],
		At:          time.UnixMicro(n[0]),
		PeriodStart: time.Unix(n[1], 0),
		PeriodEnd:   time.UnixMicro(n[2]),
		Told:        parseTold(parts[2]),
		Moves:       append(burnMoves(parts[1], head[0] == "g"), periodMoves(parts[3])...),
	}, true
}

// ClaimSweep reports whether owner may sweep the journals in the round of length every that
// holds now (by this process's clock): the first checker to ask in a round gets it, so that
// the checkers sharing a Redis sweep about once per round between them. Checkers whose clocks
// differ may both sweep near a round's edge: a recovered decision published twice is counted
// once.
func (s *Store) ClaimSweep(ctx context.Context, owner string, every time.Duration, now time.Time) (bool, error) {
	ms := max(every.Milliseconds(), 1)
	key := "rl:journal-sweep:" + strconv.FormatInt(ms, 10) + ":" + strconv.FormatInt(now.UnixMilli()/ms, 10)
	ok, err := s.rdb.SetNX(ctx, key, owner, 2*every).Result()
	if err != nil {
		return false, fmt.Errorf("bucket: journal: claim the sweep: %w", err)
	}
	return ok, nil
}
