// Package suggest finds the word a person most likely meant: the "did you mean" of the
// command line's flags and of the rules file's fields.
package suggest

// Closest returns the candidate nearest to word by edit distance (insertions, deletions,
// substitutions and transpositions of adjacent letters), if one is near enough to be a typo:
// at most a third of word's length apart, and at least one edit for short words. Ties go to the
// earlier candidate, so the caller's order decides.
func Closest(word string, candidates []string) (string, bool) {
	best, bestDist := "", len(word)/3
	if bestDist < 1 {
		bestDist = 1
	}
	found := false
	for _, c := range candidates {
		if d := distance(word, c); d <= bestDist && (!found || d < bestDist) {
			best, bestDist, found = c, d, true
		}
	}
	return best, found
}

// distance is the optimal string alignment distance between a and b, byte-wise (flag and
// field names are ASCII).
func distance(a, b string) int {
	// Three rows: the previous two (for transpositions) and the current one.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
