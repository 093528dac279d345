package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// group is script calls of one pipeline sent as ONE call of the batch script (lua/batch.lua):
// Redis then pays one EVALSHA, one script run and one reply for all of them instead of one
// each (a third of what a one-limit check cost it, in batches of 32: docs/performance.md).
// Each call is still decided by the same code, atomically and all-or-nothing on its own; the
// group only shares their overhead.
//
// A group's calls are the pipeline's on a standalone server (or a Sentinel's master), and one
// master's on a cluster, where the batch script's allow-cross-slot-keys flag lets one run touch
// the slots of all of them. A call whose slot that master no longer serves fails alone, before
// it ran, and is re-sent alone through the cluster client (errElsewhere).
//
// A loop keeps its groups across batches, so that their storage is reused.
type group struct {
	calls []*call
	args  []any
	cmd   *redis.StringSliceCmd
	fcall bool // cmd is an FCALL of the library (batcher.build)

	// heads keeps the calls' heads (head) across batches, so that a head seen before costs
	// no allocation; buf is where a head is written.
	heads map[string]string
	buf   []byte
}

// maxHeads bounds group.heads: a loop that met more distinct heads starts over.
const maxHeads = 1024

// reset empties g for a new batch.
func (g *group) reset() {
	clear(g.calls)
	g.calls = g.calls[:0]
	g.cmd = nil
}

// build sets g's command, verb (FCALL, EVALSHA or EVAL) of what (the library's function, the
// batch script's SHA1 or source), and a fresh command per call, on which distribute sets the
// call's reply. A call travels as its head, its keys and its extras (lua/batch.lua), made from
// its own arguments (addCall's).
func (g *group) build(ctx context.Context, verb, what any) {
	clear(g.args)
	g.args = g.args[:0]
	g.fcall = verb == argFCall
	g.args = append(g.args, verb, what, argZero, int64(len(g.calls)))
	for _, c := range g.calls {
		keys, argv := c.args[3:3+c.nkeys], c.args[3+c.nkeys:]
		extras := g.head(argv)
		g.args = append(g.args, keys...)
		if extras {
			g.args = append(g.args, argv[4])
			for i := 5 + 4; i < len(argv); i += 5 {
				g.args = append(g.args, argv[i])
			}
		}
		c.cmd = redis.NewStringSliceCmd(ctx)
	}
	g.cmd = redis.NewStringSliceCmd(ctx, g.args...)
}

// head appends the head of a call whose check-script ARGV is argv (lua/call.lua: n, cost, mode,
// idempotency TTL, fingerprint or charge time, then code, limit, window, burst and refund token
// per limit), and reports whether the call has extras: a fingerprint, charge time or token.
func (g *group) head(argv []any) (extras bool) {
	extras = !emptyArg(argv[4])
	for i := 5 + 4; i < len(argv); i += 5 {
		extras = extras || !emptyArg(argv[i])
	}
	b := g.buf[:0]
	for i := range 4 {
		b = appendArg(b, argv[i])
		b = append(b, ' ')
	}
	x := 0
	if extras {
		x = (len(argv)-5)/5 + 1
	}
	b = strconv.AppendInt(b, int64(x), 10)
	for i := 5; i+3 < len(argv); i += 5 {
		for _, v := range argv[i : i+4] {
			b = append(b, ' ')
			b = appendArg(b, v)
		}
	}
	g.buf = b
	h, ok := g.heads[string(b)] // no allocation for the lookup
	if !ok {
		if g.heads == nil || len(g.heads) >= maxHeads {
			g.heads = make(map[string]string)
		}
		h = string(b)
		g.heads[h] = h
	}
	g.args = append(g.args, h)
	return extras
}

// appendArg appends the text of a call's argument as go-redis would write it: addCall's
// arguments are *int64, *string, or strings boxed once.
func appendArg(b []byte, v any) []byte {
	switch v := v.(type) {
	case *int64:
		return strconv.AppendInt(b, *v, 10)
	case *string:
		return append(b, *v...)
	case string:
		return append(b, v...)
	case int64:
		return strconv.AppendInt(b, v, 10)
	}
	return fmt.Append(b, v)
}

// emptyArg reports whether a call's argument is the empty string.
func emptyArg(v any) bool {
	switch v := v.(type) {
	case *string:
		return *v == ""
	case string:
		return v == ""
	}
	return false
}

// distribute hands each call of g its part of the batch script's reply (lua/batch.lua), or the
// error the whole group got (then none of its calls ran: a script that fails as a whole,
// NOSCRIPT, OOM, a closed connection, fails before running any, or leaves the outcome unknown
// for all). A quick call's reply comes without what every quick call's has, its instant and
// replayed = 0, and gets them back here (restore).
func (g *group) distribute() {
	arr, err := g.cmd.Result()
	if err != nil {
		for _, c := range g.calls {
			c.cmd.SetErr(err)
		}
		return
	}
	if len(arr) == 0 {
		g.malformed(0)
		return
	}
	now, p := arr[0], 1
	var buf []string // the restored replies of the quick calls, carved from one allocation
	for i, c := range g.calls {
		n, ok := -1<<31, p < len(arr)
		if ok {
			var v int64
			v, ok = parseInt(arr[p])
			n = int(v)
		}
		switch m := quickEntries(n, len(arr)); {
		case !ok:
			g.malformed(i)
			return
		case n == -1 && p+1 < len(arr):
			c.cmd.SetErr(callError(arr[p+1]))
			p += 2
		case n >= 0 && p+1+n <= len(arr):
			c.cmd.SetVal(arr[p+1 : p+1+n : p+1+n])
			p += 1 + n
		case m > 0 && p+1+m <= len(arr) && now != "":
			if buf == nil {
				buf = make([]string, 0, (replyHead+replyPerLimit)*(len(g.calls)-i))
			}
			var reply []string
			buf, reply = restore(buf, now, -n-1, arr[p+1:p+1+m])
			c.cmd.SetVal(reply)
			p += 1 + m
		default:
			g.malformed(i)
			return
		}
	}
	if p != len(arr) {
		g.malformed(0)
	}
}

// quickEntries is the number of entries after a quick call's marker n = -(limits + 1) in a
// batch reply of size entries (lua/batch.lua): the limit's fields for one limit, else allowed
// and the fields of each; 0 when n marks no quick call, or more limits than the reply could
// hold.
func quickEntries(n, size int) int {
	switch limits := -n - 1; {
	case n >= -1 || limits > size:
		return 0
	case limits == 1:
		return replyPerLimit
	default:
		return 1 + replyPerLimit*limits
	}
}

// restore appends to buf the reply a quick call of limits limits would have got alone, from
// its entries e in the batch reply and the batch's instant now, and returns buf and that reply.
func restore(buf []string, now string, limits int, e []string) ([]string, []string) {
	start := len(buf)
	buf = append(buf, e[0], now, "0") // allowed: the call's, which is its one limit's
	if limits > 1 {
		e = e[1:]
	}
	buf = append(buf, e...)
	return buf, buf[start:len(buf):len(buf)]
}

// malformed fails the calls of g from the i-th on with ErrMalformedReply.
func (g *group) malformed(i int) {
	for _, c := range g.calls[i:] {
		c.cmd.SetErr(ErrMalformedReply)
	}
}

// errElsewhere is the error of a grouped call whose keys the cluster node that ran the batch
// does not serve (the slot moved, is moving, or the slot map was stale). Redis refused the
// call's first key access, so nothing of it ran: it is re-sent alone, keys declared, through
// the cluster client, which follows MOVED and ASK (isRedirect). Should it keep it, the call is
// undecided, as after a network error (Unavailable).
var errElsewhere = errors.New("bucket: key not served by the cluster node the batch ran on")

// callError is the error of one call of a group, from the message batch.lua gives it: the
// error reply the call would have got alone, but for the cluster's refusals of a key the node
// does not serve, which a call with declared keys would have got as MOVED, ASK or CLUSTERDOWN
// before it ran.
func callError(msg string) error {
	switch {
	case strings.Contains(msg, "non local key"):
		return errElsewhere
	case strings.Contains(msg, "cluster is down"):
		return replyError("CLUSTERDOWN " + msg)
	}
	return replyError(msg)
}

// replyError is a call's error reply cut out of a group's reply: a redis.Error, like the
// reply the call would have got alone, so that Unavailable and scriptError sort it the same.
type replyError string

var _ redis.Error = replyError("")

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as an error reply of Redis (redis.Error).
func (replyError) RedisError() {}

// isNoFunction reports whether err is Redis's answer to an FCALL of a function it does not
// have: nothing ran.
func isNoFunction(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(rerr.Error(), "Function not found")
}

// functionsRefused reports whether err is a server's refusal of FCALL or FUNCTION LOAD itself:
// a Redis before 7.0 does not know them, and an ACL may deny them (NOPERM). The Store then sends
// its batches to the batch script.
func functionsRefused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command")
}

// unsupported reports whether err is a server's refusal of the batch script itself: a Redis
// before 7.0 cannot compile its shebang line. The Store then sends every call alone.
func unsupported(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.Contains(msg, "Error compiling script") || strings.Contains(msg, "shebang")
}
