package bucket

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// BenchmarkReservation measures what a reservation costs Redis's scripts, per operation, from
// INFO commandstats: the check that charges its estimate (one token bucket limit; a SET of its
// record comes on top), and the settle script that refunds the difference (a GET of the record
// comes before it).
func BenchmarkReservation(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	const perCall = 32
	reqs := make([]Request, perCall)
	var reserve, settle int64
	var n int
	for i := 0; i < b.N; i += perCall {
		for j := range reqs {
			reqs[j] = one(lim(fmt.Sprintf("{rsv-bench-%d}:tb", j), algorithm.TokenBucket, 1<<40, time.Hour, 0), 40)
		}
		before := readRedisStats(b, c)
		res, err := s.Check(ctx, reqs)
		if err != nil {
			b.Fatal(err)
		}
		marks := make([]Mark, perCall)
		for j := range reqs {
			marks[j] = Mark{Key: fmt.Sprintf("{rsv-bench-%d}:rsv:%d", j, i), Request: &reqs[j], Result: &res[j]}
		}
		if err := s.Mark(ctx, time.Minute, marks); err != nil {
			b.Fatal(err)
		}
		mid := readRedisStats(b, c)
		reserve += mid.usec - before.usec
		for j := range marks {
			if _, err := s.Settle(ctx, []string{marks[j].Key}, 25, ""); err != nil {
				b.Fatal(err)
			}
		}
		settle += readRedisStats(b, c).usec - mid.usec
		n += perCall
	}
	b.ReportMetric(float64(reserve)/float64(n), "redis-script-µs/reserve")
	b.ReportMetric(float64(settle)/float64(n), "redis-script-µs/settle")
}
