package stream

import (
	"fmt"
	"hash/fnv"
	"testing"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestPartition pins the partition function: changing it would send a subject's decisions to
// another partition than the one its earlier decisions are in.
func TestPartition(t *testing.T) {
	t.Parallel()
	ref := func(s *quotaflowv1.Subject, n int) int {
		h := fnv.New32a()
		fmt.Fprintf(h, "%d:%s", int32(s.Dimension), s.Identifier)
		return int(h.Sum32() % uint32(n))
	}
	tests := []struct {
		name       string
		subject    *quotaflowv1.Subject
		partitions int
		want       int
	}{
		{"nil subject", nil, 16, 0},
		{"one partition", &quotaflowv1.Subject{Dimension: 1, Identifier: "u"}, 1, 0},
		{"no partitions", &quotaflowv1.Subject{Dimension: 1, Identifier: "u"}, 0, 0},
		{"user", &quotaflowv1.Subject{Dimension: 1, Identifier: "user-42"}, 16, -1},
		{"ip", &quotaflowv1.Subject{Dimension: 2, Identifier: "10.0.0.1"}, 16, -1},
		{"empty identifier", &quotaflowv1.Subject{Dimension: 3}, 7, -1},
		{"unknown dimension", &quotaflowv1.Subject{Dimension: -5, Identifier: "x"}, 1024, -1},
	}
	for _, tt := range tests {
		want := tt.want
		if want < 0 {
			want = ref(tt.subject, tt.partitions)
		}
		if got := Partition(tt.subject, tt.partitions); got != want {
			t.Errorf("%s: Partition = %d, want %d", tt.name, got, want)
		}
	}
	counts := make([]int, 16)
	for i := range 10000 {
		s := &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension(1 + i%3), Identifier: fmt.Sprintf("id-%d", i)}
		p := Partition(s, 16)
		if p < 0 || p >= 16 {
			t.Fatalf("Partition = %d, want 0..15", p)
		}
		if p != ref(s, 16) || p != Partition(s, 16) {
			t.Fatalf("Partition(%v) = %d, not stable", s, p)
		}
		counts[p]++
	}
	for p, n := range counts {
		if n < 10000/16/2 {
			t.Errorf("partition %d has %d of 10000 subjects, want about %d", p, n, 10000/16)
		}
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	d := &quotaflowv1.Decision{Id: "c1-7", TimeUs: 1_700_000_000_123_456, Allowed: false, Tier: "free", Endpoint: "/orders",
		Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "bob"},
		RuleId:  "orders", Remaining: 0, Limit: 10, State: quotaflowv1.State_STATE_THROTTLED, RetryAfterMs: 1500}
	want := "22:13:20.123456 DENY  user:bob                 /orders                  orders 0/10                  throttled tier=free id=c1-7 retry=1500ms"
	if got := Describe(d); got != want {
		t.Errorf("Describe\n got %q\nwant %q", got, want)
	}
	d.Allowed, d.RetryAfterMs, d.DelayUs, d.State = true, 0, 200_500, quotaflowv1.State_STATE_WARNING
	want = "22:13:20.123456 DELAY user:bob                 /orders                  orders 0/10                  warning  tier=free id=c1-7 delay=201ms"
	if got := Describe(d); got != want {
		t.Errorf("Describe of a delayed check\n got %q\nwant %q", got, want)
	}
}
