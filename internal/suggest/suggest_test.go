package suggest

import "testing"

func TestClosest(t *testing.T) {
	t.Parallel()
	flags := []string{"listen", "rules", "redis-url", "redis-timeout", "nats-url", "nats-listen"}
	tests := []struct {
		word   string
		want   string
		wantOK bool
	}{
		{"listn", "listen", true},        // a letter left out
		{"lsiten", "listen", true},       // two letters swapped
		{"rulez", "rules", true},         // one wrong
		{"redis-ulr", "redis-url", true}, // swapped near the end
		{"nats-lisen", "nats-listen", true},
		{"frobnicate", "", false}, // nothing close
		{"x", "", false},
		{"algoritm", "", false}, // not among these
	}
	for _, tt := range tests {
		t.Run(tt.word, func(t *testing.T) {
			t.Parallel()
			got, ok := Closest(tt.word, flags)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Closest(%q) = %q, %v; want %q, %v", tt.word, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestDistance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abc", "", 3},
		{"", "abc", 3},
		{"algoritm", "algorithm", 1},
		{"ab", "ba", 1},
		{"kitten", "sitting", 3},
	}
	for _, tt := range tests {
		if got := distance(tt.a, tt.b); got != tt.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
