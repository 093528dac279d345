package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// UsedMemory is the used_memory of c's server (INFO memory), in bytes: what the memory
// benchmarks compare before and after writing keys.
func UsedMemory(ctx context.Context, c redis.Cmdable) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("info memory: %w", err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("info memory has no used_memory")
}
