package backtest

import "sort"

// topK finds the subjects with the most changed answers in bounded memory: it counts every
// subject until it holds 4 × size, then keeps the size most counted and drops the rest
// (lossy counting: a dropped subject that comes back starts again from 0). Every subject with
// more changed answers than any dropped one's total stays exact, which holds for the few at
// the top that a report lists, unless changes are spread thin over very many subjects. A
// prune costs a sort of 4 × size entries, once per 3 × size new subjects.
type topK struct {
	size int
	m    map[string]*SubjectRow
}

func newTopK(size int) *topK { return &topK{size: size, m: make(map[string]*SubjectRow, 4*size)} }

// add counts denied and allowed changed answers of subject.
func (t *topK) add(subject string, denied, allowed int64) {
	row := t.m[subject]
	if row == nil {
		if len(t.m) >= 4*t.size {
			for _, r := range t.rows(len(t.m))[t.size:] {
				delete(t.m, r.Subject)
			}
		}
		row = &SubjectRow{Subject: subject}
		t.m[subject] = row
	}
	row.NewlyDenied += denied
	row.NewlyAllowed += allowed
}

func total(r *SubjectRow) int64 { return r.NewlyDenied + r.NewlyAllowed }

// rows returns the n most counted subjects, most first.
func (t *topK) rows(n int) []SubjectRow {
	out := make([]SubjectRow, 0, len(t.m))
	for _, r := range t.m {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := total(&out[i]), total(&out[j]); a != b {
			return a > b
		}
		return out[i].Subject < out[j].Subject
	})
	return out[:min(n, len(out))]
}
