package bucket

import (
	"strconv"
	"strings"
)

// A balance's moves are what a charge, a settle, a use or a new period's start did to its
// grants, unit by unit (lua/balance.lua writes them into a charge's refund token): the grant
// ledger is their sum, so that what a balance has left can be recomputed from the decisions
// that report them (checker's ledger, ClickHouse's ledger table).

// MoveKind is what a Move did.
type MoveKind byte

// The kinds, as lua/balance.lua spells them (a charge's burns have no letter of their own).
const (
	// Burned: N units of Grant burned by a charge or a use.
	Burned MoveKind = 'B'
	// Overage: N units charged past a zero balance (no grant).
	Overage MoveKind = 'O'
	// GivenBack: N units of a charge given back to Grant (a settle below its estimate).
	GivenBack MoveKind = 'G'
	// OverageBack: N units of overage given back.
	OverageBack MoveKind = 'V'
	// Forfeited: Grant's N remaining units dropped: it expired unused, or it is recurring and
	// is issued again (a void's forfeit is the void's own).
	Forfeited MoveKind = 'F'
	// Reissued: Grant, recurring, issued again for a new period, N its amount.
	Reissued MoveKind = 'R'
	// RolledOver: N units carried into Grant, a new grant "<id>~<period>" of the new period.
	RolledOver MoveKind = 'C'
)

// Move is one move of a balance.
type Move struct {
	Kind  MoveKind
	Grant string
	N     int64
}

// chargeMoves reads a balance charge's refund token: what it burned (its first part, "<ov>,
// <id>:<n>,...") as Burned and Overage moves, or, with back, what a refund gave as GivenBack
// and OverageBack; and a new period's moves (its third part; a fourth, a journaled charge's
// journal id, is not a move).
func chargeMoves(token string, back bool) []Move {
	parts := strings.SplitN(token, "|", 4)
	out := burnMoves(parts[0], back)
	if len(parts) >= 3 {
		out = append(out, periodMoves(parts[2])...)
	}
	return out
}

// burnMoves reads "<ov>,<id>:<n>,...".
func burnMoves(s string, back bool) []Move {
	if s == "" {
		return nil
	}
	grant, over := Burned, Overage
	if back {
		grant, over = GivenBack, OverageBack
	}
	var out []Move
	for i, f := range strings.Split(s, ",") {
		if i == 0 {
			if n, err := strconv.ParseInt(f, 10, 64); err == nil && n > 0 {
				out = append(out, Move{Kind: over, N: n})
			}
			continue
		}
		id, num, ok := cutLast(f, ':')
		if n, err := strconv.ParseInt(num, 10, 64); ok && err == nil && n > 0 {
			out = append(out, Move{Kind: grant, Grant: id, N: n})
		}
	}
	return out
}

// periodMoves reads "F<n>:<id>,R<n>:<id>,C<n>:<id>".
func periodMoves(s string) []Move {
	if s == "" {
		return nil
	}
	var out []Move
	for _, f := range strings.Split(s, ",") {
		if len(f) < 2 {
			continue
		}
		num, id, ok := strings.Cut(f[1:], ":")
		if n, err := strconv.ParseInt(num, 10, 64); ok && err == nil {
			out = append(out, Move{Kind: MoveKind(f[0]), Grant: id, N: n})
		}
	}
	return out
}

// keepPeriod returns the moves of ms that a refund does not undo: a new period's.
func keepPeriod(ms []Move) []Move {
	var out []Move
	for _, m := range ms {
		switch m.Kind {
		case Forfeited, Reissued, RolledOver:
			out = append(out, m)
		}
	}
	return out
}

// cutLast cuts s around the last sep: a grant's id may not hold ':' but a rollover's holds no
// more than its parent's.
func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}
