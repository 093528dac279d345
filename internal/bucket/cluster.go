package bucket

import (
	"context"
	"errors"
	"net"
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
// client, which follows the redirection and refreshes its slot map. The calls a master never
// received (its address refused the connection: it died) did not run either: once the slot
// map, read again, names another master for their slot, resendRefused sends them there.
//
// A master's calls of a round travel as one group (one call of the batch script), but for
// refunds, each sent alone: a refund writes a key before it reads the next, so a slot that moved
// under one of them could leave it half done, where a charge reads all its keys first.
type masters struct {
	cc *redis.ClusterClient
	b  *batcher
	// pipes keeps one pipeline per master client across batches (one set per batching loop).
	pipes map[*redis.Client]*masterPipe
}

type masterPipe struct {
	pipe  redis.Pipeliner
	calls int
	group group // the calls of the first round to send as one
}

// maxMasterPipes bounds the pipelines a loop keeps: clients of masters that failed over or
// left the cluster are dropped when it is reached.
const maxMasterPipes = 64

func newMasters(cc *redis.ClusterClient, b *batcher) *masters {
	return &masters{cc: cc, b: b, pipes: make(map[*redis.Client]*masterPipe)}
}

// send runs the first round of batch's calls on ctx: per master, the calls it can group as one,
// the others each with its own command.
func (m *masters) send(ctx context.Context, batch []*job) {
	if len(m.pipes) > maxMasterPipes {
		clear(m.pipes)
	}
	m.reset()
	grouping := !m.b.alone.Load()
	for _, j := range batch {
		for i := range j.calls {
			c := &j.calls[i]
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			node, err := m.cc.MasterForKey(ctx, c.firstKey())
			if err != nil {
				c.cmd.SetErr(err)
				continue
			}
			if grouping && !c.refund {
				mp := m.pipe(node)
				mp.group.calls = append(mp.group.calls, c)
				c.sentTo = node
				continue
			}
			m.add(ctx, node, c)
		}
	}
	for _, mp := range m.pipes {
		switch g := &mp.group; {
		case len(g.calls) >= m.b.minGroup():
			m.b.build(ctx, g)
			_ = mp.pipe.Process(ctx, scriptCmd{g.cmd})
			mp.calls++
		case len(g.calls) == 1:
			_ = mp.pipe.Process(ctx, scriptCmd{g.calls[0].cmd})
			mp.calls++
		}
	}
	m.exec(ctx)
	for _, mp := range m.pipes {
		if g := &mp.group; g.cmd != nil {
			m.b.settle(ctx, mp.pipe, g)
		}
	}
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

// resendRefused sends again, each to the master its slot has now, the calls of batch that a
// master never received (notSent) and whose slot the cluster has since given to another master,
// and returns how many it sent.
//
// It is what makes checks exact as soon as the cluster is after a failover: a checker that was
// idle while a master died and its replica was promoted still holds the old slot map, and its
// first calls are refused by the dead master. A call refused that way never ran, so sending it
// again cannot charge twice. The slot map is read again first, at once: ClusterClient.ReloadState
// only schedules a reload and says nothing of when it is done, while ForEachMaster reloads the
// map before it returns (go-redis's ReloadOrGet, asking the nodes in turn until one answers
// CLUSTER SLOTS). A call whose slot the map still gives to the master that refused it keeps its
// error: that master is down and the cluster has not failed over (yet), so the call is decided
// by its fail mode now, as before, rather than held until the deadline.
func (m *masters) resendRefused(ctx context.Context, batch []*job) int {
	if !refused(batch) {
		return 0
	}
	reloaded := m.cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }) == nil
	m.reset()
	sent := 0
	for _, j := range batch {
		for i := range j.calls {
			c := &j.calls[i]
			if c.sentTo == nil || !notSent(c.cmd.Err()) {
				continue
			}
			var node *redis.Client
			if reloaded {
				node, _ = m.cc.MasterForKey(ctx, c.firstKey())
			}
			if node == nil || node == c.sentTo {
				// Final: no other master to send it to. Cleared, so that the batch's later
				// rounds (TRYAGAIN) do not read the slot map again for it.
				c.sentTo = nil
				continue
			}
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			m.add(ctx, node, c)
			sent++
		}
	}
	if sent > 0 {
		m.exec(ctx)
	}
	return sent
}

// refused reports whether a call of batch was sent to a master (masters.add) and never reached
// it.
func refused(batch []*job) bool {
	for _, j := range batch {
		for i := range j.calls {
			if c := &j.calls[i]; c.sentTo != nil && notSent(c.cmd.Err()) {
				return true
			}
		}
	}
	return false
}

// reset empties the master pipelines' counts and groups before a round.
func (m *masters) reset() {
	for _, mp := range m.pipes {
		mp.calls = 0
		mp.group.reset()
	}
}

// pipe returns the pipeline of node, made on first use.
func (m *masters) pipe(node *redis.Client) *masterPipe {
	mp := m.pipes[node]
	if mp == nil {
		mp = &masterPipe{pipe: node.Pipeline()}
		m.pipes[node] = mp
	}
	return mp
}

// add queues c, whose command is set, in the pipeline of node, and records where it went.
func (m *masters) add(ctx context.Context, node *redis.Client, c *call) {
	mp := m.pipe(node)
	_ = mp.pipe.Process(ctx, scriptCmd{c.cmd})
	mp.calls++
	c.sentTo = node
}

// exec sends the pipelines that have calls, all masters at once, and waits for their replies.
func (m *masters) exec(ctx context.Context) {
	var wg sync.WaitGroup
	for _, mp := range m.pipes {
		if mp.calls > 0 {
			wg.Go(func() { _, _ = mp.pipe.Exec(ctx) })
		}
	}
	wg.Wait()
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

// notSent reports an error that proves a call was never written to a connection, so it did not
// run: the master's address refused the connection or did not answer the dial (a *net.OpError
// of "dial": go-redis takes the connection before it writes anything, and a script call is
// never retried on another connection, scriptCmd), or the master's client was closed (go-redis
// closes the clients of nodes that left the cluster). Anything after the write — a timeout, a
// connection reset or closed while the reply was awaited — may come after the script ran, and
// is never taken for this.
func notSent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, redis.ErrClosed) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// isRedirect reports a cluster's MOVED or ASK reply, or a grouped call refused for a key the
// node does not serve (errElsewhere): the call did not run on this master.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") || errors.Is(err, errElsewhere))
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
