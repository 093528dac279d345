package report

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// Width is the terminal width the tables of the commands fit when not asked for all of it
// (--wide): a terminal's default, and what reads on a laptop beside an editor.
const Width = 100

// Rules prints a table of doc's rules, one per line. With width 0 every column is printed in
// full (--wide); otherwise the table fits width: the limit shows its window (5/10s) and
// whether it is a shadow's, the burst, the flags and a descriptor's path are left out, and the
// longest endpoints and ids are cut with "…".
func Rules(w io.Writer, doc *rules.Document, width int) error {
	head := []string{"ID", "DIMENSION", "ENDPOINT", "TIER", "ALGORITHM", "LIMIT", "WINDOW", "BURST", "FLAGS"}
	if width > 0 {
		head = head[:6]
	}
	table := [][]string{head}
	for _, r := range doc.Rules {
		if width == 0 {
			table = append(table, []string{r.ID, ruleDimension(r), r.Endpoint, dash(r.Tier), dash(r.Algorithm),
				dash(string(r.Limit)), dash(string(r.Window)), dash(string(r.Burst)), dash(ruleFlags(r))})
			continue
		}
		limit := dash(string(r.Limit))
		if r.Window != "" {
			limit += "/" + string(r.Window)
		}
		if r.Shadow == "true" {
			limit += " shadow"
		}
		table = append(table, []string{r.ID, r.Dimension, r.Endpoint, dash(r.Tier), dash(r.Algorithm), limit})
	}
	// What may be cut, first to last: the id (ids differ at both ends: edge.source_cluster_…),
	// then the endpoint; never a number.
	return writeTable(w, table, width, []int{0, 2})
}

// ruleDimension is a rule's dimension, with the path a descriptor rule matches: key=value, key=*.
func ruleDimension(r rules.DocRule) string {
	if len(r.Descriptor) == 0 {
		return r.Dimension
	}
	parts := make([]string, len(r.Descriptor))
	for i, e := range r.Descriptor {
		parts[i] = e.Key + "=" + cmp.Or(e.Value, "*")
	}
	return r.Dimension + ":" + strings.Join(parts, ",")
}

// ruleFlags are what sets a rule apart from an enforced limit: shadow, its fail mode, and the
// rest, comma-separated.
func ruleFlags(r rules.DocRule) string {
	var flags []string
	for _, f := range []struct {
		set  bool
		flag string
	}{{r.Shadow == "true", "shadow"}, {r.FailMode != "", "fail_mode=" + r.FailMode}, {r.Unlimited == "true", "unlimited"},
		{r.CountDenied == "true", "count_denied"}, {r.QuotaMode == "true", "quota_mode"}, {r.Name != "", "name=" + r.Name},
		{len(r.Replaces) > 0, "replaces=" + strings.Join(r.Replaces, "+")}, {r.CandidateOf != "", "candidate_of=" + r.CandidateOf},
		{r.OnLimit == "delay", "delay<=" + string(r.MaxDelay)}} {
		if f.set {
			flags = append(flags, f.flag)
		}
	}
	return strings.Join(flags, ",")
}

// minCut is the narrowest a cut column gets: enough to tell most values apart.
const minCut = 12

// writeTable writes rows (the first the header) in columns two spaces apart. With width > 0
// the columns of cuttable are narrowed in turn, each down to minCut before the next, until a
// line fits width; their longer cells lose their middle to "…", since values that share a
// prefix (edge.source_cluster_proxy.destination_cluster_payments) differ at the end.
func writeTable(w io.Writer, rows [][]string, width int, cuttable []int) error {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	over := 2*(len(widths)-1) - width
	for _, n := range widths {
		over += n
	}
	for _, i := range cuttable {
		if width <= 0 || over <= 0 {
			break
		}
		cut := min(over, max(widths[i]-minCut, 0))
		widths[i] -= cut
		over -= cut
	}
	var b strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if r := []rune(cell); len(r) > widths[i] {
				head := (widths[i] - 1) / 2
				cell = string(r[:head]) + "…" + string(r[len(r)-(widths[i]-1-head):])
			}
			if i < len(row)-1 {
				cell += strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell)+2)
			}
			line.WriteString(cell)
		}
		fmt.Fprintln(&b, strings.TrimRight(line.String(), " "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
