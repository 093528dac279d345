package bucket

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// masters sends a batch's script calls on a Redis Cluster: one pipeline per master, straight
// to the master the client's slot map names for each call's slot, all masters at once.
//
// go-redis's cluster pipeline would split the batch by master too, but it treats the batch as
// one: when one master fails and its calls are retried, a retry cut short by the deadline sets
// its error on every call of the batch, the ones other masters answered included. A charge
// whose reply is lost that way can neither be reported nor refunded. Here each master's
// pipeline keeps its own replies, and Store.Check refunds what the masters that answered
// charged (docs/scaling.md).
//
// The calls a master answers MOVED or ASK did not run: exec re-sends them through the cluster
// client, which follows the redirection and refreshes its slot map.
type masters struct {
	cc *redis.ClusterClient
	// pipes keeps one pipeline per master client across batches (one set per batching loop).
	pipes map[*redis.Client]*masterPipe
}

type masterPipe struct {
	pipe  redis.Pipeliner
	calls int
}

// maxMasterPipes bounds the pipelines a loop keeps: clients of masters that failed over or
// left the cluster are dropped when it is reached.
const maxMasterPipes = 64

func newMasters(cc *redis.ClusterClient) *masters {
	return &masters{cc: cc, pipes: make(map[*redis.Client]*masterPipe)}
}

// send runs the first round of batch's calls, each with its own command, on ctx.
func (m *masters) send(ctx context.Context, batch []*job) {
	if len(m.pipes) > maxMasterPipes {
		clear(m.pipes)
	}
	for _, mp := range m.pipes {
		mp.calls = 0
	}
	for _, j := range batch {
		for i := range j.calls {
			c := &j.calls[i]
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			node, err := m.cc.MasterForKey(ctx, c.firstKey())
			if err != nil {
				c.cmd.SetErr(err)
				continue
			}
			mp := m.pipes[node]
			if mp == nil {
				mp = &masterPipe{pipe: node.Pipeline()}
				m.pipes[node] = mp
			}
			_ = mp.pipe.Process(ctx, scriptCmd{c.cmd})
			mp.calls++
		}
	}
	var wg sync.WaitGroup
	for _, mp := range m.pipes {
		if mp.calls > 0 {
			wg.Go(func() { _, _ = mp.pipe.Exec(ctx) })
		}
	}
	wg.Wait()
	for _, j := range batch {
		for i := range j.calls {
			if err := j.calls[i].cmd.Err(); err != nil && !isRedirect(err) && stale(err) {
				// The slot map may be out of date: a master died, failed over or moved slots.
				m.cc.ReloadState(ctx)
				return
			}
		}
	}
}

// stale reports an error after which the cluster client should read the slot map again: a
// network error, or a master saying the cluster is down or that it no longer owns the slot.
func stale(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network or deadline: the master may be gone
	}
	return redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "MOVED")
}

// isRedirect reports a cluster's MOVED or ASK reply: the call did not run on this master.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}

// firstKey is the call's first key, which names its slot (every key of a call shares it).
func (c *call) firstKey() string {
	switch k := c.args[3].(type) {
	case *string:
		return *k
	case string:
		return k
	}
	return ""
}
