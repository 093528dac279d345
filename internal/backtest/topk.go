package backtest

import "sort"

// topK finds the subjects with the most changed answers in bounded memory, by the Space-Saving
// algorithm (Metwally et al.): it counts up to size subjects; a new one past that takes the
// place of the least counted, inheriting its count as an overestimate. Every subject whose
// true count is above total/size is kept, so a size of ten times the rows reported leaves the
// top rows exact unless the changes are spread thin.
type topK struct {
	size int
	m    map[string]*SubjectRow
}

func newTopK(size int) *topK { return &topK{size: size, m: make(map[string]*SubjectRow, size)} }

// add counts denied and allowed changed answers of subject.
func (t *topK) add(subject string, denied, allowed int64) {
	if row := t.m[subject]; row != nil {
		row.NewlyDenied += denied
		row.NewlyAllowed += allowed
		return
	}
	if len(t.m) < t.size {
		t.m[subject] = &SubjectRow{Subject: subject, NewlyDenied: denied, NewlyAllowed: allowed}
		return
	}
	var least *SubjectRow
	for _, row := range t.m {
		if least == nil || total(row) < total(least) {
			least = row
		}
	}
	delete(t.m, least.Subject)
	least.Subject = subject
	least.NewlyDenied += denied
	least.NewlyAllowed += allowed
	t.m[subject] = least
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
